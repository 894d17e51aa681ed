//! The replication command language: what a client sends in a Query message on a replication
//! connection.
//!
//! Grammar (after PostgreSQL 15's repl_gram.y; keywords are case-insensitive here, so that a
//! hand-typed lower-case command works, where PostgreSQL 15 accepts upper case only):
//! ```text
//! IDENTIFY_SYSTEM
//! SHOW name[.name...]
//! TIMELINE_HISTORY n                                           n > 0
//! CREATE_REPLICATION_SLOT slot [TEMPORARY] PHYSICAL [RESERVE_WAL]
//! CREATE_REPLICATION_SLOT slot [TEMPORARY] PHYSICAL ( option [value] [, ...] )
//! READ_REPLICATION_SLOT slot
//! DROP_REPLICATION_SLOT slot [WAIT]
//! START_REPLICATION [SLOT slot] [PHYSICAL] X/X [TIMELINE n]
//! ```
//! each optionally followed by `;`. Identifiers are bare (down-cased) or double-quoted (kept
//! as written, `""` standing for one `"`). Logical replication, BASE_BACKUP and the other
//! replication commands of PostgreSQL parse to [`ReplicationCommand::NotSupported`]. A query
//! whose first word is not a replication keyword is SQL ([`ReplicationCommand::Sql`]), which a
//! physical walsender refuses.

use std::fmt;

use wal_types::{Lsn, SlotNameError, TimelineId};

use crate::messages::{ErrorFields, SqlState};

/// A parsed replication command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicationCommand {
    IdentifySystem,
    Show {
        name: String,
    },
    TimelineHistory {
        timeline: TimelineId,
    },
    CreateReplicationSlot {
        slot_name: String,
        temporary: bool,
        reserve_wal: bool,
    },
    ReadReplicationSlot {
        slot_name: String,
    },
    DropReplicationSlot {
        slot_name: String,
        wait: bool,
    },
    StartReplication {
        slot_name: Option<String>,
        start: Lsn,
        timeline: Option<TimelineId>,
    },
    /// A replication command walserver does not implement (logical replication, BASE_BACKUP,
    /// ...). `what` names it for the error message.
    NotSupported {
        what: String,
    },
    /// Not a replication command: SQL, or an empty query.
    Sql {
        query: String,
    },
}

/// The HINT of a refused `BASE_BACKUP`: where a standby's base backup comes from instead.
pub const BASE_BACKUP_HINT: &str = "walserver stores only WAL, not data files: take the base \
    backup from the PostgreSQL primary with pg_basebackup, then point the standby's \
    primary_conninfo at walserver";

impl ReplicationCommand {
    /// The ERROR a physical walsender answers NotSupported and Sql with, or `None` for the
    /// commands it executes.
    pub fn refusal(&self) -> Option<ErrorFields> {
        match self {
            ReplicationCommand::NotSupported { what } => {
                let e = ErrorFields::error(
                    SqlState::FEATURE_NOT_SUPPORTED,
                    format!("{what} is not supported by walserver"),
                );
                // pg_basebackup is how a new PostgreSQL standby starts; the operator who
                // tries it here needs to know where the data files are.
                Some(if what == "BASE_BACKUP" {
                    e.hint(BASE_BACKUP_HINT)
                } else {
                    e
                })
            }
            ReplicationCommand::Sql { .. } => Some(ErrorFields::error(
                SqlState::FEATURE_NOT_SUPPORTED,
                "cannot execute SQL commands in WAL sender for physical replication",
            )),
            _ => None,
        }
    }
}

/// A command as PostgreSQL 15's clients would send it: keywords upper case, identifiers
/// double-quoted, slot options in the parenthesised syntax. `parse_command` of the output
/// gives the command back.
impl fmt::Display for ReplicationCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplicationCommand::IdentifySystem => f.write_str("IDENTIFY_SYSTEM"),
            // One quoted identifier: `SHOW a.b` and `SHOW "a.b"` both name "a.b" (PostgreSQL
            // joins the parts with dots too), and a part may itself hold a dot.
            ReplicationCommand::Show { name } => write!(f, "SHOW {}", quote_ident(name)),
            ReplicationCommand::TimelineHistory { timeline } => {
                write!(f, "TIMELINE_HISTORY {timeline}")
            }
            ReplicationCommand::CreateReplicationSlot {
                slot_name,
                temporary,
                reserve_wal,
            } => {
                write!(f, "CREATE_REPLICATION_SLOT {}", quote_ident(slot_name))?;
                if *temporary {
                    f.write_str(" TEMPORARY")?;
                }
                f.write_str(" PHYSICAL")?;
                if *reserve_wal {
                    f.write_str(" (RESERVE_WAL)")?;
                }
                Ok(())
            }
            ReplicationCommand::ReadReplicationSlot { slot_name } => {
                write!(f, "READ_REPLICATION_SLOT {}", quote_ident(slot_name))
            }
            ReplicationCommand::DropReplicationSlot { slot_name, wait } => {
                write!(f, "DROP_REPLICATION_SLOT {}", quote_ident(slot_name))?;
                if *wait {
                    f.write_str(" WAIT")?;
                }
                Ok(())
            }
            ReplicationCommand::StartReplication {
                slot_name,
                start,
                timeline,
            } => {
                f.write_str("START_REPLICATION")?;
                if let Some(slot) = slot_name {
                    write!(f, " SLOT {}", quote_ident(slot))?;
                }
                write!(f, " PHYSICAL {start}")?;
                if let Some(tli) = timeline {
                    write!(f, " TIMELINE {tli}")?;
                }
                Ok(())
            }
            ReplicationCommand::NotSupported { what } => f.write_str(what),
            ReplicationCommand::Sql { query } => f.write_str(query),
        }
    }
}

/// `s` as a double-quoted identifier.
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// What PostgreSQL 15's replication command parser says of any command it cannot parse: its
/// bison grammar's words, without the SQL parser's "at or near" or a position.
const SYNTAX_ERROR: &str = "syntax error";

/// Why a command could not be parsed or a slot name is not acceptable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// A syntax error (42601). `position` is the 1-based character position of the
    /// offending token, for walserver's own log; the ErrorResponse carries none, as PostgreSQL
    /// 15's replication command parser sends none.
    #[error("{message}")]
    Syntax { position: usize, message: String },
    /// 42602 (or 42622 when too long), from [`validate_slot_name`].
    #[error("{message}")]
    InvalidSlotName { code: SqlState, message: String },
    /// An option of `CREATE_REPLICATION_SLOT (...)` that no kind of slot has. PostgreSQL's
    /// grammar takes any name there and its walsender refuses it afterwards with an internal
    /// error (XX000), which is what a PostgreSQL 15 primary answers.
    #[error("unrecognized option: {name}")]
    UnrecognizedOption { name: String },
}

impl CommandError {
    pub fn sqlstate(&self) -> SqlState {
        match self {
            CommandError::Syntax { .. } => SqlState::SYNTAX_ERROR,
            CommandError::InvalidSlotName { code, .. } => *code,
            CommandError::UnrecognizedOption { .. } => SqlState::INTERNAL_ERROR,
        }
    }

    /// The ERROR to send for this (the session goes on).
    pub fn to_error_fields(&self) -> ErrorFields {
        match self {
            CommandError::Syntax { message, .. } => {
                ErrorFields::error(SqlState::SYNTAX_ERROR, message.clone())
            }
            CommandError::InvalidSlotName { code, message } => {
                let e = ErrorFields::error(*code, message.clone());
                if *code == SqlState::INVALID_NAME && message.ends_with("invalid character") {
                    e.hint("Replication slot names may only contain lower case letters, numbers, and the underscore character.")
                } else {
                    e
                }
            }
            CommandError::UnrecognizedOption { .. } => {
                ErrorFields::error(SqlState::INTERNAL_ERROR, self.to_string())
            }
        }
    }
}

pub use wal_types::MAX_SLOT_NAME_LEN;

/// PostgreSQL's `ReplicationSlotValidateName` ([`wal_types::validate_slot_name`]), as the
/// ERROR PostgreSQL sends.
pub fn validate_slot_name(name: &str) -> Result<(), CommandError> {
    wal_types::validate_slot_name(name).map_err(|e| CommandError::InvalidSlotName {
        code: match e {
            SlotNameError::TooLong => SqlState::NAME_TOO_LONG,
            SlotNameError::TooShort | SlotNameError::InvalidCharacter => SqlState::INVALID_NAME,
        },
        message: format!("replication slot name \"{name}\" {e}"),
    })
}

/// Parses one replication command.
pub fn parse_command(query: &str) -> Result<ReplicationCommand, CommandError> {
    let mut p = Parser {
        lexer: Lexer::new(query),
        peeked: None,
    };
    // Only the first word decides between SQL and the replication grammar, as PostgreSQL's
    // `replication_scanner_is_replication_command` does; SQL is never tokenized further.
    let first = match p.lexer.clone().next_token() {
        Ok(Some(tok)) => tok,
        Ok(None) | Err(_) => {
            return Ok(ReplicationCommand::Sql {
                query: query.to_string(),
            })
        }
    };
    let keyword = match &first.kind {
        Tok::Ident {
            text,
            quoted: false,
        } => text.to_ascii_uppercase(),
        _ => String::new(),
    };
    let command = match keyword.as_str() {
        "IDENTIFY_SYSTEM" => {
            p.next()?;
            ReplicationCommand::IdentifySystem
        }
        "SHOW" => {
            p.next()?;
            let mut name = p.ident()?;
            while p.eat_punct('.')? {
                name.push('.');
                name.push_str(&p.ident()?);
            }
            ReplicationCommand::Show { name }
        }
        "TIMELINE_HISTORY" => {
            p.next()?;
            ReplicationCommand::TimelineHistory {
                timeline: p.timeline()?,
            }
        }
        "CREATE_REPLICATION_SLOT" => {
            p.next()?;
            return p.create_slot();
        }
        "READ_REPLICATION_SLOT" => {
            p.next()?;
            ReplicationCommand::ReadReplicationSlot {
                slot_name: p.ident()?,
            }
        }
        "DROP_REPLICATION_SLOT" => {
            p.next()?;
            let slot_name = p.ident()?;
            let wait = p.eat_keyword("WAIT")?;
            ReplicationCommand::DropReplicationSlot { slot_name, wait }
        }
        "START_REPLICATION" => {
            p.next()?;
            return p.start_replication();
        }
        "BASE_BACKUP" | "ALTER_REPLICATION_SLOT" | "UPLOAD_MANIFEST" => {
            return Ok(ReplicationCommand::NotSupported { what: keyword })
        }
        _ => {
            return Ok(ReplicationCommand::Sql {
                query: query.to_string(),
            })
        }
    };
    p.end()?;
    Ok(command)
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident { text: String, quoted: bool },
    Number(String),
    Lsn(String),
    Str(String),
    Punct(char),
}

#[derive(Clone, Debug)]
struct Token {
    kind: Tok,
    /// 1-based character position of the token's first character.
    position: usize,
}

#[derive(Clone)]
struct Lexer<'a> {
    input: &'a str,
    /// Byte offset of the next character.
    at: usize,
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || !c.is_ascii()
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '$' || !c.is_ascii()
}

impl<'a> Lexer<'a> {
    fn new(input: &'a str) -> Lexer<'a> {
        Lexer { input, at: 0 }
    }

    fn position(&self, byte_offset: usize) -> usize {
        self.input[..byte_offset].chars().count() + 1
    }

    fn syntax(&self, byte_offset: usize, message: impl Into<String>) -> CommandError {
        CommandError::Syntax {
            position: self.position(byte_offset),
            message: message.into(),
        }
    }

    fn next_token(&mut self) -> Result<Option<Token>, CommandError> {
        let rest = &self.input[self.at..];
        let trimmed = rest.trim_start_matches([' ', '\t', '\n', '\r', '\x0c']);
        self.at += rest.len() - trimmed.len();
        let start = self.at;
        let mut chars = trimmed.chars();
        let Some(c) = chars.next() else {
            return Ok(None);
        };
        let kind = if let Some(len) = lsn_len(trimmed) {
            self.at += len;
            Tok::Lsn(trimmed[..len].to_string())
        } else if c.is_ascii_digit() {
            let len = trimmed
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(trimmed.len());
            self.at += len;
            Tok::Number(trimmed[..len].to_string())
        } else if is_ident_start(c) {
            let len = trimmed
                .find(|c: char| !is_ident_char(c))
                .unwrap_or(trimmed.len());
            self.at += len;
            Tok::Ident {
                text: trimmed[..len].to_ascii_lowercase(),
                quoted: false,
            }
        } else if c == '"' || c == '\'' {
            // PostgreSQL 15's replication scanner calls either kind unterminated a "quoted
            // string", and takes `""` as an empty name, which no slot or parameter has.
            let (text, len) = quoted(trimmed, c)
                .ok_or_else(|| self.syntax(start, "unterminated quoted string"))?;
            self.at += len;
            if c == '"' {
                Tok::Ident { text, quoted: true }
            } else {
                Tok::Str(text)
            }
        } else if "(),;.=".contains(c) {
            self.at += 1;
            Tok::Punct(c)
        } else {
            return Err(self.syntax(start, SYNTAX_ERROR));
        };
        Ok(Some(Token {
            kind,
            position: self.position(start),
        }))
    }
}

/// The length of an `X/X` LSN at the start of `s` (hex digits, `/`, hex digits), if one is.
fn lsn_len(s: &str) -> Option<usize> {
    let hi = s.find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(s.len());
    if hi == 0 || !s[hi..].starts_with('/') {
        return None;
    }
    let rest = &s[hi + 1..];
    let lo = rest
        .find(|c: char| !c.is_ascii_hexdigit())
        .unwrap_or(rest.len());
    (lo > 0).then_some(hi + 1 + lo)
}

/// A quoted token at the start of `s` (which begins with `quote`): its unescaped text and its
/// length in bytes. A doubled quote stands for one.
fn quoted(s: &str, quote: char) -> Option<(String, usize)> {
    let mut text = String::new();
    let mut iter = s.char_indices().skip(1).peekable();
    while let Some((i, c)) = iter.next() {
        if c == quote {
            if let Some(&(_, next)) = iter.peek() {
                if next == quote {
                    text.push(quote);
                    iter.next();
                    continue;
                }
            }
            return Some((text, i + 1));
        }
        text.push(c);
    }
    None
}

struct Parser<'a> {
    lexer: Lexer<'a>,
    peeked: Option<Option<Token>>,
}

impl Parser<'_> {
    fn peek(&mut self) -> Result<Option<&Token>, CommandError> {
        if self.peeked.is_none() {
            self.peeked = Some(self.lexer.next_token()?);
        }
        Ok(self.peeked.as_ref().and_then(|t| t.as_ref()))
    }

    fn next(&mut self) -> Result<Option<Token>, CommandError> {
        match self.peeked.take() {
            Some(t) => Ok(t),
            None => self.lexer.next_token(),
        }
    }

    /// A syntax error at the next token (or at the end).
    fn unexpected(&mut self) -> CommandError {
        let end = self.lexer.input.chars().count() + 1;
        match self.peek() {
            Ok(Some(t)) => CommandError::Syntax {
                position: t.position,
                message: SYNTAX_ERROR.into(),
            },
            Ok(None) => CommandError::Syntax {
                position: end,
                message: SYNTAX_ERROR.into(),
            },
            Err(e) => e,
        }
    }

    fn ident(&mut self) -> Result<String, CommandError> {
        if let Some(Token {
            kind: Tok::Ident { text, .. },
            ..
        }) = self.peek()?.cloned()
        {
            self.next()?;
            return Ok(text);
        }
        Err(self.unexpected())
    }

    fn is_keyword(&mut self, kw: &str) -> Result<bool, CommandError> {
        Ok(matches!(
            self.peek()?,
            Some(Token { kind: Tok::Ident { text, quoted: false }, .. }) if text.eq_ignore_ascii_case(kw)
        ))
    }

    fn eat_keyword(&mut self, kw: &str) -> Result<bool, CommandError> {
        if self.is_keyword(kw)? {
            self.next()?;
            return Ok(true);
        }
        Ok(false)
    }

    fn eat_punct(&mut self, p: char) -> Result<bool, CommandError> {
        if matches!(self.peek()?, Some(Token { kind: Tok::Punct(c), .. }) if *c == p) {
            self.next()?;
            return Ok(true);
        }
        Ok(false)
    }

    fn expect_punct(&mut self, p: char) -> Result<(), CommandError> {
        if self.eat_punct(p)? {
            Ok(())
        } else {
            Err(self.unexpected())
        }
    }

    /// An optional `;`, then the end of the input.
    fn end(&mut self) -> Result<(), CommandError> {
        self.eat_punct(';')?;
        if self.peek()?.is_some() {
            return Err(self.unexpected());
        }
        Ok(())
    }

    fn timeline(&mut self) -> Result<TimelineId, CommandError> {
        let Some(Token {
            kind: Tok::Number(n),
            position,
            ..
        }) = self.peek()?.cloned()
        else {
            return Err(self.unexpected());
        };
        self.next()?;
        match n.parse::<u32>() {
            Ok(0) | Err(_) => Err(CommandError::Syntax {
                position,
                message: format!("invalid timeline {n}"),
            }),
            Ok(t) => Ok(TimelineId(t)),
        }
    }

    fn create_slot(&mut self) -> Result<ReplicationCommand, CommandError> {
        let slot_name = self.ident()?;
        let temporary = self.eat_keyword("TEMPORARY")?;
        if self.is_keyword("LOGICAL")? {
            return Ok(ReplicationCommand::NotSupported {
                what: "CREATE_REPLICATION_SLOT ... LOGICAL".into(),
            });
        }
        if !self.eat_keyword("PHYSICAL")? {
            return Err(self.unexpected());
        }
        let mut reserve_wal = None;
        if self.eat_punct('(')? {
            loop {
                let Some(Token {
                    kind: Tok::Ident { text: name, .. },
                    position,
                    ..
                }) = self.peek()?.cloned()
                else {
                    return Err(self.unexpected());
                };
                self.next()?;
                let value = self.option_value()?;
                // As PostgreSQL 15: the logical slots' options are "conflicting" on a
                // physical slot, a name no slot has is unrecognized.
                match name.as_str() {
                    "reserve_wal" => {}
                    "snapshot" | "two_phase" => {
                        return Err(CommandError::Syntax {
                            position,
                            message: "conflicting or redundant options".into(),
                        })
                    }
                    _ => return Err(CommandError::UnrecognizedOption { name }),
                }
                if reserve_wal.is_some() {
                    return Err(CommandError::Syntax {
                        position,
                        message: "conflicting or redundant options".into(),
                    });
                }
                reserve_wal = Some(match value {
                    None => true,
                    Some(v) => parse_bool(&v).ok_or_else(|| CommandError::Syntax {
                        position,
                        message: format!("{name} requires a Boolean value"),
                    })?,
                });
                if self.eat_punct(')')? {
                    break;
                }
                self.expect_punct(',')?;
            }
        } else {
            // The legacy syntax: bare keywords after PHYSICAL.
            while let Some(Token {
                kind:
                    Tok::Ident {
                        text,
                        quoted: false,
                    },
                position,
                ..
            }) = self.peek()?.cloned()
            {
                self.next()?;
                let message = match text.as_str() {
                    "reserve_wal" if reserve_wal.is_none() => {
                        reserve_wal = Some(true);
                        continue;
                    }
                    // The logical slots' keywords, as PostgreSQL 15 answers them on a
                    // physical slot.
                    "reserve_wal" | "export_snapshot" | "noexport_snapshot" | "use_snapshot"
                    | "two_phase" => "conflicting or redundant options".to_string(),
                    _ => SYNTAX_ERROR.to_string(),
                };
                return Err(CommandError::Syntax { position, message });
            }
        }
        self.end()?;
        Ok(ReplicationCommand::CreateReplicationSlot {
            slot_name,
            temporary,
            reserve_wal: reserve_wal.unwrap_or(false),
        })
    }

    /// The optional value after a parenthesised option's name.
    fn option_value(&mut self) -> Result<Option<String>, CommandError> {
        match self.peek()? {
            Some(Token {
                kind: Tok::Ident { text: v, .. } | Tok::Str(v) | Tok::Number(v),
                ..
            }) => {
                let v = v.clone();
                self.next()?;
                Ok(Some(v))
            }
            _ => Ok(None),
        }
    }

    fn start_replication(&mut self) -> Result<ReplicationCommand, CommandError> {
        let slot_name = if self.eat_keyword("SLOT")? {
            Some(self.ident()?)
        } else {
            None
        };
        if self.is_keyword("LOGICAL")? {
            // PostgreSQL's grammar has logical replication only from a slot.
            if slot_name.is_none() {
                return Err(self.unexpected());
            }
            return Ok(ReplicationCommand::NotSupported {
                what: "START_REPLICATION ... LOGICAL".into(),
            });
        }
        self.eat_keyword("PHYSICAL")?;
        let Some(Token {
            kind: Tok::Lsn(text),
            position,
            ..
        }) = self.peek()?.cloned()
        else {
            return Err(self.unexpected());
        };
        self.next()?;
        let start = text.parse::<Lsn>().map_err(|_| CommandError::Syntax {
            position,
            message: format!("invalid WAL location \"{text}\""),
        })?;
        let timeline = if self.eat_keyword("TIMELINE")? {
            Some(self.timeline()?)
        } else {
            None
        };
        self.end()?;
        Ok(ReplicationCommand::StartReplication {
            slot_name,
            start,
            timeline,
        })
    }
}

/// PostgreSQL's `defGetBoolean`, which reads a command's option: `true`, `on`, `1`, `false`,
/// `off`, `0` in any case; not a configuration parameter's `yes`, `no` or prefixes.
fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "on" | "1" => Some(true),
        "false" | "off" | "0" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ReplicationCommand as C;

    fn check(query: &str, expected: ReplicationCommand) {
        assert_eq!(parse_command(query), Ok(expected), "{query:?}");
    }

    fn check_err(query: &str, position: usize, message: &str) {
        assert_eq!(
            parse_command(query),
            Err(CommandError::Syntax {
                position,
                message: message.into()
            }),
            "{query:?}"
        );
    }

    fn start(slot: Option<&str>, lsn: u64, tli: Option<u32>) -> ReplicationCommand {
        C::StartReplication {
            slot_name: slot.map(str::to_string),
            start: Lsn(lsn),
            timeline: tli.map(TimelineId),
        }
    }

    fn create(name: &str, temporary: bool, reserve_wal: bool) -> ReplicationCommand {
        C::CreateReplicationSlot {
            slot_name: name.into(),
            temporary,
            reserve_wal,
        }
    }

    #[test]
    fn what_postgresql_clients_send() {
        // Every command pg_receivewal, pg_basebackup and a PostgreSQL 15 standby were seen sending.
        check("IDENTIFY_SYSTEM", C::IdentifySystem);
        check(
            "SHOW data_directory_mode",
            C::Show {
                name: "data_directory_mode".into(),
            },
        );
        check(
            "SHOW wal_segment_size",
            C::Show {
                name: "wal_segment_size".into(),
            },
        );
        check(
            "CREATE_REPLICATION_SLOT \"capslot\" PHYSICAL",
            create("capslot", false, false),
        );
        check(
            "READ_REPLICATION_SLOT capslot",
            C::ReadReplicationSlot {
                slot_name: "capslot".into(),
            },
        );
        check(
            "START_REPLICATION SLOT \"capslot\" 0/1000000 TIMELINE 1",
            start(Some("capslot"), 0x100_0000, Some(1)),
        );
        check(
            "START_REPLICATION 0/5000000 TIMELINE 2",
            start(None, 0x500_0000, Some(2)),
        );
        check(
            "TIMELINE_HISTORY 2",
            C::TimelineHistory {
                timeline: TimelineId(2),
            },
        );
        check(
            "CREATE_REPLICATION_SLOT \"pg_walreceiver_1234\" TEMPORARY PHYSICAL ( RESERVE_WAL)",
            create("pg_walreceiver_1234", true, true),
        );
        check(
            "CREATE_REPLICATION_SLOT s1 PHYSICAL RESERVE_WAL",
            create("s1", false, true),
        );
    }

    #[test]
    fn syntax_variants() {
        check("identify_system", C::IdentifySystem);
        check("  IDENTIFY_SYSTEM ;  ", C::IdentifySystem);
        check("Identify_System;", C::IdentifySystem);
        check(
            "\tSHOW\nTimeZone",
            C::Show {
                name: "timezone".into(),
            },
        );
        check(
            "SHOW \"TimeZone\"",
            C::Show {
                name: "TimeZone".into(),
            },
        );
        check("SHOW a.b", C::Show { name: "a.b".into() });
        check(
            "start_replication slot S1 physical 0/0",
            start(Some("s1"), 0, None),
        );
        check(
            "START_REPLICATION PHYSICAL 1/ABCDEF01 TIMELINE 3;",
            start(None, 0x1_ABCD_EF01, Some(3)),
        );
        check(
            "START_REPLICATION 0/01000000",
            start(None, 0x100_0000, None),
        );
        check(
            "START_REPLICATION SLOT \"we\"\"ird\" 0/0",
            start(Some("we\"ird"), 0, None),
        );
        check(
            "CREATE_REPLICATION_SLOT s TEMPORARY PHYSICAL (RESERVE_WAL false)",
            create("s", true, false),
        );
        check(
            "CREATE_REPLICATION_SLOT s PHYSICAL (reserve_wal 'on')",
            create("s", false, true),
        );
        check(
            "CREATE_REPLICATION_SLOT s PHYSICAL (RESERVE_WAL 1)",
            create("s", false, true),
        );
        check(
            "DROP_REPLICATION_SLOT s1 WAIT",
            C::DropReplicationSlot {
                slot_name: "s1".into(),
                wait: true,
            },
        );
        check(
            "DROP_REPLICATION_SLOT \"S1\"",
            C::DropReplicationSlot {
                slot_name: "S1".into(),
                wait: false,
            },
        );
    }

    #[test]
    fn not_replication_commands() {
        for q in [
            "SELECT 1",
            "",
            "   ",
            ";",
            "select pg_current_wal_lsn()",
            "\"x",
            "1",
        ] {
            check(q, C::Sql { query: q.into() });
        }
        let refusal = parse_command("SELECT 1").unwrap().refusal().unwrap();
        assert_eq!(refusal.code(), Some(SqlState::FEATURE_NOT_SUPPORTED));
        assert_eq!(
            refusal.message(),
            Some("cannot execute SQL commands in WAL sender for physical replication")
        );
    }

    #[test]
    fn unsupported_commands() {
        for (q, what) in [
            ("BASE_BACKUP (LABEL 'x')", "BASE_BACKUP"),
            ("base_backup", "BASE_BACKUP"),
            ("UPLOAD_MANIFEST", "UPLOAD_MANIFEST"),
            (
                "ALTER_REPLICATION_SLOT s (FAILOVER)",
                "ALTER_REPLICATION_SLOT",
            ),
            (
                "CREATE_REPLICATION_SLOT s LOGICAL pgoutput",
                "CREATE_REPLICATION_SLOT ... LOGICAL",
            ),
            (
                "CREATE_REPLICATION_SLOT s TEMPORARY LOGICAL test_decoding (SNAPSHOT 'nothing')",
                "CREATE_REPLICATION_SLOT ... LOGICAL",
            ),
            (
                "START_REPLICATION SLOT s LOGICAL 0/0 (proto_version '1')",
                "START_REPLICATION ... LOGICAL",
            ),
        ] {
            check(q, C::NotSupported { what: what.into() });
            let e = parse_command(q).unwrap().refusal().unwrap();
            assert_eq!(e.code(), Some(SqlState::FEATURE_NOT_SUPPORTED));
            // Only BASE_BACKUP's refusal says where base backups come from.
            let hint = e.get(ErrorFields::HINT);
            assert_eq!(
                hint,
                (what == "BASE_BACKUP").then_some(BASE_BACKUP_HINT),
                "{q}"
            );
        }
        assert!(C::IdentifySystem.refusal().is_none());
    }

    /// Each command and what a PostgreSQL 15.18 walsender answered it with (none of these
    /// answers carries a position).
    #[test]
    fn syntax_errors_are_postgresql_15s() {
        check_err("IDENTIFY_SYSTEM x", 17, "syntax error");
        check_err("SHOW", 5, "syntax error");
        check_err("TIMELINE_HISTORY 0", 18, "invalid timeline 0");
        check_err(
            "TIMELINE_HISTORY 99999999999",
            18,
            "invalid timeline 99999999999",
        );
        check_err("TIMELINE_HISTORY x", 18, "syntax error");
        check_err("START_REPLICATION", 18, "syntax error");
        check_err("START_REPLICATION SLOT 0/0", 24, "syntax error");
        check_err("START_REPLICATION 0/0 TIMELINE", 31, "syntax error");
        check_err(
            "START_REPLICATION 123456789/0",
            19,
            "invalid WAL location \"123456789/0\"",
        );
        check_err("START_REPLICATION 0/0; x", 24, "syntax error");
        check_err("CREATE_REPLICATION_SLOT s", 26, "syntax error");
        // What a PostgreSQL 15 primary answers to an option no slot has: XX000, no position.
        let e = parse_command("CREATE_REPLICATION_SLOT s PHYSICAL (FOO)").unwrap_err();
        assert_eq!(e, CommandError::UnrecognizedOption { name: "foo".into() });
        assert_eq!(e.to_string(), "unrecognized option: foo");
        assert_eq!(e.to_error_fields().code(), Some(SqlState::INTERNAL_ERROR));
        // And to a logical slot's option on a physical one: 42601 "conflicting".
        check_err(
            "CREATE_REPLICATION_SLOT s PHYSICAL (TWO_PHASE)",
            37,
            "conflicting or redundant options",
        );
        check_err(
            "CREATE_REPLICATION_SLOT s PHYSICAL (SNAPSHOT 'export')",
            37,
            "conflicting or redundant options",
        );
        check_err(
            "CREATE_REPLICATION_SLOT s PHYSICAL (RESERVE_WAL maybe)",
            37,
            "reserve_wal requires a Boolean value",
        );
        check_err(
            "CREATE_REPLICATION_SLOT s PHYSICAL (RESERVE_WAL, RESERVE_WAL)",
            50,
            "conflicting or redundant options",
        );
        check_err("CREATE_REPLICATION_SLOT s PHYSICAL ()", 37, "syntax error");
        check_err(
            "CREATE_REPLICATION_SLOT s PHYSICAL EXPORT_SNAPSHOT",
            36,
            "conflicting or redundant options",
        );
        check_err(
            "CREATE_REPLICATION_SLOT s PHYSICAL TWO_PHASE",
            36,
            "conflicting or redundant options",
        );
        // An empty quoted name parses; no slot has it (the walsender answers 42704).
        assert!(matches!(
            parse_command("DROP_REPLICATION_SLOT \"\""),
            Ok(ReplicationCommand::DropReplicationSlot { .. })
        ));
        check_err(
            "DROP_REPLICATION_SLOT \"s",
            23,
            "unterminated quoted string",
        );
        check_err("DROP_REPLICATION_SLOT s NOW", 25, "syntax error");
        check_err("SHOW a!", 7, "syntax error");
        check_err("START_REPLICATION LOGICAL 0/0", 19, "syntax error");
        check_err(
            "CREATE_REPLICATION_SLOT s PHYSICAL (RESERVE_WAL yes)",
            37,
            "reserve_wal requires a Boolean value",
        );
        // Positions count characters, not bytes.
        check_err("SHOW \"é\" x", 10, "syntax error");
        let e = parse_command("SHOW").unwrap_err();
        assert_eq!(e.sqlstate(), SqlState::SYNTAX_ERROR);
        assert_eq!(e.to_error_fields().get(ErrorFields::POSITION), None);
    }

    #[test]
    fn slot_names() {
        assert!(validate_slot_name("pg_walreceiver_42").is_ok());
        assert!(validate_slot_name(&"a".repeat(63)).is_ok());
        let check = |name: &str, code: SqlState, message: &str| {
            let e = validate_slot_name(name).unwrap_err();
            assert_eq!(e.sqlstate(), code, "{name}");
            assert_eq!(e.to_string(), message);
        };
        check(
            "S1",
            SqlState::INVALID_NAME,
            "replication slot name \"S1\" contains invalid character",
        );
        check(
            "a-b",
            SqlState::INVALID_NAME,
            "replication slot name \"a-b\" contains invalid character",
        );
        check(
            "",
            SqlState::INVALID_NAME,
            "replication slot name \"\" is too short",
        );
        let long = "a".repeat(64);
        check(
            &long,
            SqlState::NAME_TOO_LONG,
            &format!("replication slot name \"{long}\" is too long"),
        );
        let hint = validate_slot_name("S").unwrap_err().to_error_fields();
        assert!(hint.get(ErrorFields::HINT).is_some());
    }

    #[test]
    fn display_parses_back() {
        for c in [
            C::IdentifySystem,
            C::Show {
                name: "TimeZone".into(),
            },
            C::TimelineHistory {
                timeline: TimelineId(7),
            },
            create("a\"b", true, true),
            create("s", false, false),
            C::ReadReplicationSlot {
                slot_name: "x y".into(),
            },
            C::DropReplicationSlot {
                slot_name: "d".into(),
                wait: true,
            },
            start(Some("s"), u64::MAX, Some(u32::MAX)),
            start(None, 0, None),
            // Found by the command fuzz target: a quoted name holding a dot once printed as
            // `"a".""`, which does not parse.
            C::Show { name: "a.".into() },
            C::Show {
                name: "\"x\".y".into(),
            },
        ] {
            assert_eq!(parse_command(&c.to_string()), Ok(c.clone()), "{c}");
        }
    }
}
