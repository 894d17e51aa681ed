//! How durable an append must be before it is acknowledged ([`Durability`], with PostgreSQL's
//! `synchronous_commit` names), and how appends wait for synchronous standbys
//! ([`SyncSettings`]).

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// How durable an append must be before it is acknowledged, with PostgreSQL's
/// `synchronous_commit` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// Flushed on this node.
    Local,
    /// Also written (not necessarily flushed) by the synchronous standbys.
    RemoteWrite,
    /// Also flushed by the synchronous standbys (PostgreSQL's `on`, "remote flush").
    On,
    /// Also applied by the synchronous standbys' applications.
    RemoteApply,
}

impl Durability {
    pub const ALL: [Durability; 4] = [
        Durability::Local,
        Durability::RemoteWrite,
        Durability::On,
        Durability::RemoteApply,
    ];
}

impl FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> Result<Durability, String> {
        match s.to_ascii_lowercase().as_str() {
            "local" | "off" => Ok(Durability::Local),
            "remote_write" => Ok(Durability::RemoteWrite),
            "on" | "remote_flush" | "true" | "yes" | "1" => Ok(Durability::On),
            "remote_apply" => Ok(Durability::RemoteApply),
            _ => Err(format!(
                "invalid durability {s:?}: expected local, remote_write, on (remote_flush) or remote_apply"
            )),
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Durability::Local => "local",
            Durability::RemoteWrite => "remote_write",
            Durability::On => "on",
            Durability::RemoteApply => "remote_apply",
        })
    }
}

/// How appends wait for synchronous standbys: PostgreSQL's `synchronous_standby_names`,
/// `synchronous_commit`, and walserver's `synchronous_wait_timeout`.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncSettings {
    pub standby_names: Option<walsender_actor::syncrep::SyncStandbyNames>,
    /// The durability of an append that does not name one.
    pub default_durability: Durability,
    /// After this long an append still waiting for standbys fails with
    /// [`AppendError::NotConfirmed`](crate::AppendError::NotConfirmed); `None` waits as long as it takes, as PostgreSQL does.
    pub wait_timeout: Option<std::time::Duration>,
}

impl Default for SyncSettings {
    fn default() -> Self {
        SyncSettings {
            standby_names: None,
            default_durability: Durability::On,
            wait_timeout: None,
        }
    }
}

impl Durability {
    /// The standby position this level waits for, `None` for `local`.
    pub fn wait_level(self) -> Option<walsender_actor::syncrep::WaitLevel> {
        use walsender_actor::syncrep::WaitLevel;
        match self {
            Durability::Local => None,
            Durability::RemoteWrite => Some(WaitLevel::Write),
            Durability::On => Some(WaitLevel::Flush),
            Durability::RemoteApply => Some(WaitLevel::Apply),
        }
    }
}
