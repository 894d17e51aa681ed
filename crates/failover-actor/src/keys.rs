//! The keys under `/walserver/<cluster>/` and the JSON of the values that are not views.
//!
//! - `leader`: the leader's node name, on the leader's lease; created only when absent, so
//!   its create revision is the term.
//! - `members/<name>`: [`crate::MemberInfo`], on the member's own lease.
//! - `sync`: [`SyncRecord`], written by the leader in a transaction guarded by its key.
//! - `pause`: present while automatic action is off (any value).
//! - `switchover`: [`SwitchoverRecord`]: who hands over to whom.
//! - `history/<term>`: [`crate::TermRecord`], on no lease.
//! - `slots/<name>`: a permanent slot ([`PermanentSlotRecord`], on no lease): created by an
//!   operator (`walserver cluster slots add`), its position written by the leader.

use serde::{Deserialize, Serialize};

/// The key names of one cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(cluster: &str) -> Keys {
        Keys {
            prefix: format!("/walserver/{cluster}/"),
        }
    }

    /// Every key of the cluster (what the actor watches).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn leader(&self) -> String {
        format!("{}leader", self.prefix)
    }

    pub fn members(&self) -> String {
        format!("{}members/", self.prefix)
    }

    pub fn member(&self, name: &str) -> String {
        format!("{}members/{name}", self.prefix)
    }

    pub fn sync(&self) -> String {
        format!("{}sync", self.prefix)
    }

    pub fn pause(&self) -> String {
        format!("{}pause", self.prefix)
    }

    pub fn switchover(&self) -> String {
        format!("{}switchover", self.prefix)
    }

    pub fn history(&self) -> String {
        format!("{}history/", self.prefix)
    }

    /// Every permanent slot's key.
    pub fn permanent_slots(&self) -> String {
        format!("{}slots/", self.prefix)
    }

    pub fn permanent_slot(&self, name: &str) -> String {
        format!("{}slots/{name}", self.prefix)
    }

    /// `history/<term>`, the term zero-padded so that the keys sort by term.
    pub fn history_of(&self, term: u64) -> String {
        format!("{}history/{term:020}", self.prefix)
    }

    /// What a key under the prefix is.
    pub fn classify<'k>(&self, key: &'k [u8]) -> KeyKind<'k> {
        let Some(rest) = key.strip_prefix(self.prefix.as_bytes()) else {
            return KeyKind::Other;
        };
        match rest {
            b"leader" => KeyKind::Leader,
            b"sync" => KeyKind::Sync,
            b"pause" => KeyKind::Pause,
            b"switchover" => KeyKind::Switchover,
            _ => {
                let named = |prefix: &[u8]| {
                    let name = std::str::from_utf8(rest.strip_prefix(prefix)?).ok()?;
                    (!name.is_empty()).then_some(name)
                };
                if let Some(name) = named(b"members/") {
                    KeyKind::Member(name)
                } else if let Some(name) = named(b"slots/") {
                    KeyKind::Slot(name)
                } else if rest.starts_with(b"history/") {
                    KeyKind::History
                } else {
                    KeyKind::Other
                }
            }
        }
    }
}

/// A key under the cluster's prefix, by what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind<'k> {
    Leader,
    Member(&'k str),
    Sync,
    Pause,
    Switchover,
    History,
    /// `slots/<name>`: a permanent slot.
    Slot(&'k str),
    Other,
}

/// `slots/<name>`: a slot that exists on whichever member leads. `restart_lsn` is where the
/// leader's slot last held WAL from (written by the leader as its clients confirm, once per
/// segment), `None` until a leader has made it; standbys keep a copy of the slot at this
/// position, so that whichever of them leads next still has the WAL the slot's client needs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermanentSlotRecord {
    pub restart_lsn: Option<wal_storage::Lsn>,
    /// The term of the leader that wrote the position.
    pub term: Option<u64>,
}

/// `sync`: which standby the leader of `term` counts acknowledgements from (`None`: none,
/// appends are asynchronous and no standby may be promoted automatically).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncRecord {
    pub leader: String,
    pub sync_standby: Option<String>,
    pub term: u64,
}

/// `switchover`: the leader `from` hands its key to `to` (`force`: without waiting for it to
/// catch up). Only `to` may campaign while it exists.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchoverRecord {
    pub from: String,
    pub to: String,
    #[serde(default)]
    pub force: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_classified_by_name() {
        let k = Keys::new("c1");
        assert_eq!(k.classify(k.leader().as_bytes()), KeyKind::Leader);
        assert_eq!(k.classify(k.member("n2").as_bytes()), KeyKind::Member("n2"));
        assert_eq!(k.classify(k.sync().as_bytes()), KeyKind::Sync);
        assert_eq!(k.classify(k.pause().as_bytes()), KeyKind::Pause);
        assert_eq!(k.classify(k.switchover().as_bytes()), KeyKind::Switchover);
        assert_eq!(k.classify(k.history_of(7).as_bytes()), KeyKind::History);
        assert_eq!(
            k.classify(k.permanent_slot("s1").as_bytes()),
            KeyKind::Slot("s1")
        );
        assert_eq!(k.classify(k.permanent_slots().as_bytes()), KeyKind::Other);
        assert_eq!(k.classify(b"/walserver/c2/leader"), KeyKind::Other);
        assert_eq!(k.classify(k.members().as_bytes()), KeyKind::Other);
    }

    #[test]
    fn history_keys_sort_by_term() {
        let k = Keys::new("c");
        assert!(k.history_of(9) < k.history_of(10));
    }
}
