//! The kind of WAL a node holds ([`WalFormat`]), fixed at init, and the node's [`Role`],
//! recorded beside it in the control data. A leaf, so that errors can name them without
//! depending on the configuration.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What kind of WAL a node stores. Fixed at init and recorded in the control file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WalFormat {
    /// walserver's own records (see `format.rs`): appended here or relayed from a walserver
    /// upstream. Records can be decoded, and the node can be promoted.
    Walserver,
    /// PostgreSQL WAL relayed byte for byte from a PostgreSQL upstream. Never parsed: no appends
    /// and no promotion.
    #[serde(rename = "postgresql")]
    Postgres,
}

impl fmt::Display for WalFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WalFormat::Walserver => "walserver",
            WalFormat::Postgres => "postgresql",
        })
    }
}

/// Whether the node is a primary or a standby, as the control data records it. Promotion
/// records `Primary` in the same atomic control file write that makes the new timeline
/// current, so the role and the timeline change together; `Wal::set_role` records `Standby`
/// (`walserver rejoin`). Data directories made before the role was recorded have none: their
/// role is whether they hold `standby.signal` (the supervisor's rule).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Primary,
    Standby,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Primary => "primary",
            Role::Standby => "standby",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_names() {
        assert_eq!(WalFormat::Postgres.to_string(), "postgresql");
        assert_eq!(
            serde_json::to_string(&WalFormat::Walserver).unwrap(),
            "\"walserver\""
        );
        assert_eq!(
            serde_json::from_str::<WalFormat>("\"postgresql\"").unwrap(),
            WalFormat::Postgres
        );
    }
}
