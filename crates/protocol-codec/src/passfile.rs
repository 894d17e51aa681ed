//! libpq's password file (`~/.pgpass`, `PGPASSFILE`, or the `passfile` connection option): where
//! a standby's `primary_conninfo` without a password finds one, as a PostgreSQL standby's does.
//! `pg_basebackup -R` writes `passfile=...` into the `primary_conninfo` it makes when the
//! backup itself used one, so a configuration copied from such a standby needs it.
//!
//! Format, one entry per line: `hostname:port:database:username:password`. Each of the first
//! four fields is a literal or `*`, which matches anything; `\` escapes the next character (a
//! `:` or `\` in a field). The first line that matches wins. A line starting with `#` is a
//! comment. A physical replication connection matches the database `replication`. This module
//! only reads the text; reading the file, and refusing one that its group or others may read
//! (libpq ignores it, with a warning), is the caller's.

/// The password of the first entry of `contents` that matches the connection, if any.
pub fn find_password(
    contents: &str,
    host: &str,
    port: u16,
    database: &str,
    user: &str,
) -> Option<String> {
    let port = port.to_string();
    contents.lines().find_map(|line| {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let rest = matches(line, host)?;
        let rest = matches(rest, &port)?;
        let rest = matches(rest, database)?;
        let rest = matches(rest, user)?;
        Some(unescape(rest))
    })
}

/// If `field`, the start of `line` up to an unescaped `:`, is `*` or equals `value` (escapes
/// read), what follows that `:`.
fn matches<'a>(line: &'a str, value: &str) -> Option<&'a str> {
    if let Some(rest) = line.strip_prefix("*:") {
        return Some(rest);
    }
    let mut want = value.chars();
    let mut chars = line.char_indices();
    while let Some((i, c)) = chars.next() {
        let c = match c {
            ':' => {
                return want.next().is_none().then(|| &line[i + 1..]);
            }
            '\\' => chars.next()?.1,
            c => c,
        };
        if want.next() != Some(c) {
            return None;
        }
    }
    // A line that ends before its password field matches nothing.
    None
}

/// The password field with its escapes read, as libpq reads it: a `\` stands for the
/// character after it (a last, lone one for itself), and an unescaped `:` ends the field.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut chars = field.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ':' => break,
            '\\' => out.push(chars.next().unwrap_or('\\')),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_matching_line_wins_with_wildcards_and_escapes() {
        let file = "\
# hostname:port:database:username:password
db1:5432:replication:repl:first
*:5433:replication:repl:any\\:host
db\\:2:*:*:repl:colon in the host
db3:5432:*:*:back\\\\slash
*:*:*:repl:last resort\r
";
        let find = |h: &str, p: u16, d: &str, u: &str| find_password(file, h, p, d, u);
        assert_eq!(
            find("db1", 5432, "replication", "repl"),
            Some("first".into())
        );
        assert_eq!(
            find("elsewhere", 5433, "replication", "repl"),
            Some("any:host".into())
        );
        assert_eq!(
            find("db:2", 1, "x", "repl"),
            Some("colon in the host".into())
        );
        assert_eq!(find("db:2", 1, "x", "y"), None);
        assert_eq!(
            find("db3", 5432, "replication", "u"),
            Some("back\\slash".into())
        );
        assert_eq!(
            find("db1", 5432, "postgres", "repl"),
            Some("last resort".into())
        );
        assert_eq!(find("db1", 5432, "postgres", "other"), None);
        // A field must match whole: db1 is not db10.
        assert_eq!(find("db10", 5432, "replication", "nobody"), None);
    }

    #[test]
    fn short_and_odd_lines_match_nothing() {
        for file in ["", "#a:b:c:d:e", "h:1:d", "h:1:d:u", "\\"] {
            assert_eq!(find_password(file, "h", 1, "d", "u"), None, "{file:?}");
        }
        assert_eq!(
            find_password("h:1:d:u:", "h", 1, "d", "u"),
            Some(String::new())
        );
        // An unescaped colon ends the password; a last, lone backslash is itself.
        assert_eq!(
            find_password("h:1:d:u:pw:more", "h", 1, "d", "u"),
            Some("pw".into())
        );
        assert_eq!(
            find_password("h:1:d:u:pw\\", "h", 1, "d", "u"),
            Some("pw\\".into())
        );
    }
}
