//! The string parameters PostgreSQL 15 checks by rules alone, read as it reads them:
//! `client_encoding` (its encoding names and aliases), `DateStyle` (styles and field orders
//! laid over the current value) and `application_name` (bytes outside printable ASCII become
//! `?`). The other string parameters are kept as the client gave them
//! (see `parameter_values`).

/// PostgreSQL's encoding names and their aliases (`encnames.c`), as its `clean_encoding_name`
/// leaves them (lower case, letters and digits only), with each encoding's name.
const ENCODINGS: &[(&str, &str)] = &[
    ("abc", "WIN1258"),
    ("alt", "WIN866"),
    ("big5", "BIG5"),
    ("euccn", "EUC_CN"),
    ("eucjis2004", "EUC_JIS_2004"),
    ("eucjp", "EUC_JP"),
    ("euckr", "EUC_KR"),
    ("euctw", "EUC_TW"),
    ("gb18030", "GB18030"),
    ("gbk", "GBK"),
    ("iso88591", "LATIN1"),
    ("iso885910", "LATIN6"),
    ("iso885913", "LATIN7"),
    ("iso885914", "LATIN8"),
    ("iso885915", "LATIN9"),
    ("iso885916", "LATIN10"),
    ("iso88592", "LATIN2"),
    ("iso88593", "LATIN3"),
    ("iso88594", "LATIN4"),
    ("iso88595", "ISO_8859_5"),
    ("iso88596", "ISO_8859_6"),
    ("iso88597", "ISO_8859_7"),
    ("iso88598", "ISO_8859_8"),
    ("iso88599", "LATIN5"),
    ("johab", "JOHAB"),
    ("koi8", "KOI8R"),
    ("koi8r", "KOI8R"),
    ("koi8u", "KOI8U"),
    ("latin1", "LATIN1"),
    ("latin10", "LATIN10"),
    ("latin2", "LATIN2"),
    ("latin3", "LATIN3"),
    ("latin4", "LATIN4"),
    ("latin5", "LATIN5"),
    ("latin6", "LATIN6"),
    ("latin7", "LATIN7"),
    ("latin8", "LATIN8"),
    ("latin9", "LATIN9"),
    ("mskanji", "SJIS"),
    ("muleinternal", "MULE_INTERNAL"),
    ("shiftjis", "SJIS"),
    ("shiftjis2004", "SHIFT_JIS_2004"),
    ("sjis", "SJIS"),
    ("sqlascii", "SQL_ASCII"),
    ("tcvn", "WIN1258"),
    ("tcvn5712", "WIN1258"),
    ("uhc", "UHC"),
    ("unicode", "UTF8"),
    ("utf8", "UTF8"),
    ("vscii", "WIN1258"),
    ("win", "WIN1251"),
    ("win1250", "WIN1250"),
    ("win1251", "WIN1251"),
    ("win1252", "WIN1252"),
    ("win1253", "WIN1253"),
    ("win1254", "WIN1254"),
    ("win1255", "WIN1255"),
    ("win1256", "WIN1256"),
    ("win1257", "WIN1257"),
    ("win1258", "WIN1258"),
    ("win866", "WIN866"),
    ("win874", "WIN874"),
    ("win932", "SJIS"),
    ("win936", "GBK"),
    ("win949", "UHC"),
    ("win950", "BIG5"),
    ("windows1250", "WIN1250"),
    ("windows1251", "WIN1251"),
    ("windows1252", "WIN1252"),
    ("windows1253", "WIN1253"),
    ("windows1254", "WIN1254"),
    ("windows1255", "WIN1255"),
    ("windows1256", "WIN1256"),
    ("windows1257", "WIN1257"),
    ("windows1258", "WIN1258"),
    ("windows866", "WIN866"),
    ("windows874", "WIN874"),
    ("windows932", "SJIS"),
    ("windows936", "GBK"),
    ("windows949", "UHC"),
    ("windows950", "BIG5"),
];

/// A client encoding's name as PostgreSQL reports it, or `None` for a name it does not know.
/// `UNICODE`, spelt so, is kept, as PostgreSQL keeps it for old JDBC drivers.
pub fn client_encoding(name: &str) -> Option<&str> {
    let clean: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    let found = ENCODINGS
        .binary_search_by(|(alias, _)| (*alias).cmp(clean.as_str()))
        .ok()
        .map(|i| ENCODINGS[i].1)?;
    Some(if name == "UNICODE" { name } else { found })
}

/// PostgreSQL's `check_datestyle`: `value`, a comma-separated list of output styles (`ISO`,
/// `SQL`, `Postgres`, `German`), field orders (`YMD`, `DMY` or `Euro...`, `MDY` or `US` or
/// `NonEuro...`) and `DEFAULT`, laid over `current`; the result as `Style, ORDER`. An error
/// is PostgreSQL's detail.
pub fn date_style_value(current: &str, value: &str) -> Result<String, String> {
    const DEFAULT: (&str, &str) = ("ISO", "MDY");
    let (mut style, mut order) = current.split_once(", ").unwrap_or(DEFAULT);
    let (mut have_style, mut have_order, mut conflict) = (false, false, false);
    let words = split_identifiers(value).ok_or("List syntax is invalid.")?;
    for word in &words {
        let w = word.to_ascii_lowercase();
        let mut set_style = |s: &'static str| {
            conflict |= have_style && style != s;
            style = s;
            have_style = true;
        };
        match w.as_str() {
            "iso" => set_style("ISO"),
            "sql" => set_style("SQL"),
            w if w.starts_with("postgres") => set_style("Postgres"),
            "german" => {
                set_style("German");
                if !have_order {
                    order = "DMY";
                }
            }
            "default" => {
                if !have_style {
                    style = DEFAULT.0;
                }
                if !have_order {
                    order = DEFAULT.1;
                }
            }
            _ => {
                let o = match w.as_str() {
                    "ymd" => "YMD",
                    "dmy" => "DMY",
                    w if w.starts_with("euro") => "DMY",
                    "mdy" | "us" => "MDY",
                    w if w.starts_with("noneuro") => "MDY",
                    _ => return Err(format!("Unrecognized key word: \"{word}\".")),
                };
                conflict |= have_order && order != o;
                order = o;
                have_order = true;
            }
        }
    }
    if conflict {
        return Err("Conflicting \"datestyle\" specifications.".into());
    }
    Ok(format!("{style}, {order}"))
}

/// PostgreSQL's `SplitIdentifierString` with `,`: names separated by commas and white space,
/// `"quoted"` (a doubled quote is one quote) or bare; `None` for bad syntax. The empty string
/// is an empty list.
fn split_identifiers(s: &str) -> Option<Vec<String>> {
    let space = |c: char| matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c');
    let mut rest = s.trim_start_matches(space);
    let mut out = Vec::new();
    if rest.is_empty() {
        return Some(out);
    }
    loop {
        if let Some(q) = rest.strip_prefix('"') {
            let mut name = String::new();
            let mut after = q;
            loop {
                let end = after.find('"')?;
                name.push_str(&after[..end]);
                after = &after[end + 1..];
                match after.strip_prefix('"') {
                    Some(more) => {
                        name.push('"');
                        after = more;
                    }
                    None => break,
                }
            }
            out.push(name);
            rest = after;
        } else {
            let end = rest
                .find(|c: char| c == ',' || space(c))
                .unwrap_or(rest.len());
            if end == 0 {
                return None;
            }
            out.push(rest[..end].to_string());
            rest = &rest[end..];
        }
        rest = rest.trim_start_matches(space);
        match rest.strip_prefix(',') {
            Some(next) => rest = next.trim_start_matches(space),
            None if rest.is_empty() => return Some(out),
            None => return None,
        }
    }
}

/// PostgreSQL's `pg_clean_ascii`: every byte outside printable ASCII becomes `?`.
pub fn clean_ascii(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if (32..127).contains(&b) {
                b as char
            } else {
                '?'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_encoding_alias_is_sorted_and_clean() {
        for w in ENCODINGS.windows(2) {
            assert!(w[0].0 < w[1].0, "{} before {}", w[0].0, w[1].0);
        }
        for (alias, name) in ENCODINGS {
            assert!(alias
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
            assert_eq!(client_encoding(name), Some(*name), "{name} names itself");
        }
    }
}
