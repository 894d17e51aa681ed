//! ErrorResponse and NoticeResponse fields, and SQLSTATE codes.

use std::fmt;

/// A five-character SQLSTATE code, such as `08P01`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SqlState([u8; 5]);

impl SqlState {
    pub const SUCCESSFUL_COMPLETION: SqlState = SqlState(*b"00000");
    pub const CONNECTION_FAILURE: SqlState = SqlState(*b"08006");
    pub const PROTOCOL_VIOLATION: SqlState = SqlState(*b"08P01");
    pub const FEATURE_NOT_SUPPORTED: SqlState = SqlState(*b"0A000");
    pub const INVALID_PARAMETER_VALUE: SqlState = SqlState(*b"22023");
    pub const INVALID_AUTHORIZATION_SPECIFICATION: SqlState = SqlState(*b"28000");
    pub const INVALID_PASSWORD: SqlState = SqlState(*b"28P01");
    pub const INVALID_CATALOG_NAME: SqlState = SqlState(*b"3D000");
    pub const INSUFFICIENT_PRIVILEGE: SqlState = SqlState(*b"42501");
    pub const SYNTAX_ERROR: SqlState = SqlState(*b"42601");
    pub const INVALID_NAME: SqlState = SqlState(*b"42602");
    pub const NAME_TOO_LONG: SqlState = SqlState(*b"42622");
    pub const UNDEFINED_OBJECT: SqlState = SqlState(*b"42704");
    pub const DUPLICATE_OBJECT: SqlState = SqlState(*b"42710");
    pub const TOO_MANY_CONNECTIONS: SqlState = SqlState(*b"53300");
    pub const OBJECT_NOT_IN_PREREQUISITE_STATE: SqlState = SqlState(*b"55000");
    pub const OBJECT_IN_USE: SqlState = SqlState(*b"55006");
    pub const CANT_CHANGE_RUNTIME_PARAM: SqlState = SqlState(*b"55P02");
    pub const QUERY_CANCELED: SqlState = SqlState(*b"57014");
    pub const ADMIN_SHUTDOWN: SqlState = SqlState(*b"57P01");
    pub const UNDEFINED_FILE: SqlState = SqlState(*b"58P01");
    pub const INTERNAL_ERROR: SqlState = SqlState(*b"XX000");

    /// A code from its text; `None` unless it is five ASCII digits or upper-case letters.
    pub fn from_code(code: &str) -> Option<SqlState> {
        let b: [u8; 5] = code.as_bytes().try_into().ok()?;
        b.iter()
            .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase())
            .then_some(SqlState(b))
    }

    pub fn as_str(&self) -> &str {
        // Constructed only from ASCII, so this cannot fail.
        std::str::from_utf8(&self.0).expect("SQLSTATE is ASCII")
    }
}

impl fmt::Display for SqlState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for SqlState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SqlState({})", self.as_str())
    }
}

/// The fields of an ErrorResponse or NoticeResponse, in wire order.
///
/// Format (the body of `'E'` and `'N'`):
/// ```text
/// { Byte1 field code, String value }*  Byte1 0
/// ```
/// Field codes PostgreSQL uses: `S` severity (localized), `V` severity (never localized,
/// PG ≥ 9.6), `C` SQLSTATE, `M` message, `D` detail, `H` hint, `P` position, `p` internal
/// position, `q` internal query, `W` where, `s` schema, `t` table, `c` column, `d` data type,
/// `n` constraint, `F` file, `L` line, `R` routine. Unknown codes must be ignored by readers;
/// we keep them so that re-encoding gives the same bytes.
///
/// Values are decoded leniently (invalid UTF-8 is replaced), because a server's messages may be
/// in its own encoding and losing a character is better than losing the error.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorFields {
    pub fields: Vec<(u8, String)>,
}

impl ErrorFields {
    pub const SEVERITY: u8 = b'S';
    pub const SEVERITY_NONLOCALIZED: u8 = b'V';
    pub const CODE: u8 = b'C';
    pub const MESSAGE: u8 = b'M';
    pub const DETAIL: u8 = b'D';
    pub const HINT: u8 = b'H';
    pub const POSITION: u8 = b'P';
    pub const INTERNAL_POSITION: u8 = b'p';
    pub const INTERNAL_QUERY: u8 = b'q';
    pub const WHERE: u8 = b'W';
    pub const SCHEMA: u8 = b's';
    pub const TABLE: u8 = b't';
    pub const COLUMN: u8 = b'c';
    pub const DATA_TYPE: u8 = b'd';
    pub const CONSTRAINT: u8 = b'n';
    pub const FILE: u8 = b'F';
    pub const LINE: u8 = b'L';
    pub const ROUTINE: u8 = b'R';

    /// A report with the given severity, code and message: `S`, `V`, `C` and `M`, as
    /// PostgreSQL sends them.
    pub fn new(severity: &str, code: SqlState, message: impl Into<String>) -> ErrorFields {
        ErrorFields {
            fields: vec![
                (Self::SEVERITY, severity.to_string()),
                (Self::SEVERITY_NONLOCALIZED, severity.to_string()),
                (Self::CODE, code.as_str().to_string()),
                (Self::MESSAGE, message.into()),
            ],
        }
    }

    /// An ERROR: the command fails and the session goes on (the server sends ReadyForQuery).
    pub fn error(code: SqlState, message: impl Into<String>) -> ErrorFields {
        ErrorFields::new("ERROR", code, message)
    }

    /// A FATAL error: the server closes the connection after sending it.
    pub fn fatal(code: SqlState, message: impl Into<String>) -> ErrorFields {
        ErrorFields::new("FATAL", code, message)
    }

    /// A NOTICE-level report, for a NoticeResponse.
    pub fn notice(code: SqlState, message: impl Into<String>) -> ErrorFields {
        ErrorFields::new("NOTICE", code, message)
    }

    /// Adds (or replaces) a field.
    pub fn with(mut self, code: u8, value: impl Into<String>) -> ErrorFields {
        let value = value.into();
        match self.fields.iter_mut().find(|(c, _)| *c == code) {
            Some(slot) => slot.1 = value,
            None => self.fields.push((code, value)),
        }
        self
    }

    pub fn detail(self, detail: impl Into<String>) -> ErrorFields {
        self.with(Self::DETAIL, detail)
    }

    pub fn hint(self, hint: impl Into<String>) -> ErrorFields {
        self.with(Self::HINT, hint)
    }

    /// The 1-based character position in the query that the error points at.
    pub fn position(self, position: usize) -> ErrorFields {
        self.with(Self::POSITION, position.to_string())
    }

    pub fn get(&self, code: u8) -> Option<&str> {
        self.fields
            .iter()
            .find(|(c, _)| *c == code)
            .map(|(_, v)| v.as_str())
    }

    /// The non-localized severity if present, else the localized one.
    pub fn severity(&self) -> Option<&str> {
        self.get(Self::SEVERITY_NONLOCALIZED)
            .or_else(|| self.get(Self::SEVERITY))
    }

    pub fn code(&self) -> Option<SqlState> {
        self.get(Self::CODE).and_then(SqlState::from_code)
    }

    pub fn message(&self) -> Option<&str> {
        self.get(Self::MESSAGE)
    }

    /// Whether the server will close the connection after this report.
    pub fn is_fatal(&self) -> bool {
        matches!(self.severity(), Some("FATAL" | "PANIC"))
    }
}

impl fmt::Display for ErrorFields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}",
            self.severity().unwrap_or("ERROR"),
            self.message().unwrap_or("(no message)")
        )?;
        if let Some(code) = self.get(Self::CODE) {
            write!(f, " (SQLSTATE {code})")?;
        }
        if let Some(detail) = self.get(Self::DETAIL) {
            write!(f, "\nDETAIL: {detail}")?;
        }
        if let Some(hint) = self.get(Self::HINT) {
            write!(f, "\nHINT: {hint}")?;
        }
        Ok(())
    }
}
