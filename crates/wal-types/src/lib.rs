//! The few types every walserver crate speaks in, kept in one leaf crate so that
//! `wal-storage` and `protocol-codec` can share them without depending on each other.
//!
//! - [`Lsn`]: a byte position in the WAL stream, shown and parsed as PostgreSQL's `X/X`.
//! - [`TimelineId`]: PostgreSQL's timeline number; timeline 1 is the first.
//! - [`SystemId`]: the 64-bit database system identifier a cluster is born with.
//! - [`PgTimestamp`]: PostgreSQL's `TimestampTz` on the wire, microseconds since 2000-01-01 UTC.
//! - [`time`]: instants and lags as walserver's status rows show them (PostgreSQL's text),
//!   with the serde helpers those rows use.
//! - [`metrics`]: the fixed-bucket latency histogram the crates that own a fact keep for the
//!   admin API's `/metrics`.
//! - [`validate_slot_name`]: PostgreSQL's rule for replication slot names, which the replication
//!   command parser and storage both apply (each wraps [`SlotNameError`] in its own error).
//!
//! This crate does no I/O and has no dependencies beyond serde and thiserror.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub mod metrics;
pub mod time;

/// A log sequence number: the byte position of a point in the WAL stream.
///
/// Shown as PostgreSQL 15 shows it (`%X/%X`: the high and low 32 bits in upper-case hex,
/// unpadded, e.g. `0/1000000`). Parsing also accepts lower-case hex and PostgreSQL 18's
/// zero-padded form (`0/01000000`). `Lsn(0)` is PostgreSQL's "invalid" position.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    /// PostgreSQL's `InvalidXLogRecPtr`.
    pub const INVALID: Lsn = Lsn(0);
    pub const MAX: Lsn = Lsn(u64::MAX);

    pub fn is_valid(self) -> bool {
        self.0 != 0
    }

    /// The start of the segment that holds this LSN. `segment_size` must be a power of two.
    pub fn segment_start(self, segment_size: u64) -> Lsn {
        debug_assert!(segment_size.is_power_of_two());
        Lsn(self.0 & !(segment_size - 1))
    }

    /// The segment number (`lsn / segment_size`), as PostgreSQL's `XLByteToSeg` computes it.
    pub fn segment_number(self, segment_size: u64) -> u64 {
        self.0 / segment_size
    }

    /// The offset of this LSN within its segment.
    pub fn segment_offset(self, segment_size: u64) -> u64 {
        self.0 & (segment_size - 1)
    }

    /// `self + n`, or `None` past `u64::MAX`.
    pub fn checked_add(self, n: u64) -> Option<Lsn> {
        self.0.checked_add(n).map(Lsn)
    }

    /// The number of bytes from `earlier` up to `self`, zero if `earlier` is ahead.
    pub fn saturating_sub(self, earlier: Lsn) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// `lsn + n`, for positions this process computed itself.
///
/// # Panics
///
/// If the sum passes `u64::MAX`, in release builds too: an LSN that near 2^64 is a broken
/// invariant, never something to wrap around. Positions and lengths that come from the
/// network or the disk go through [`Lsn::checked_add`] and fail with an error instead.
impl std::ops::Add<u64> for Lsn {
    type Output = Lsn;
    fn add(self, rhs: u64) -> Lsn {
        self.checked_add(rhs)
            .unwrap_or_else(|| panic!("LSN overflow: {self} + {rhs} passes FFFFFFFF/FFFFFFFF"))
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 as u32)
    }
}

impl fmt::Debug for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Lsn({self})")
    }
}

/// Why a string is not an LSN.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid LSN {input:?}: expected two hexadecimal numbers of at most 8 digits separated by '/', like 0/1000000")]
pub struct ParseLsnError {
    pub input: String,
}

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(s: &str) -> Result<Lsn, ParseLsnError> {
        let err = || ParseLsnError {
            input: s.to_string(),
        };
        let (hi, lo) = s.split_once('/').ok_or_else(err)?;
        let part = |p: &str| -> Result<u32, ParseLsnError> {
            if p.is_empty() || p.len() > 8 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err());
            }
            u32::from_str_radix(p, 16).map_err(|_| err())
        };
        Ok(Lsn(((part(hi)? as u64) << 32) | part(lo)? as u64))
    }
}

impl Serialize for Lsn {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Lsn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Lsn, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A PostgreSQL timeline. Timeline 1 is the first; every promotion starts the next one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TimelineId(pub u32);

impl TimelineId {
    pub const FIRST: TimelineId = TimelineId(1);

    pub fn next(self) -> TimelineId {
        TimelineId(self.0 + 1)
    }
}

impl fmt::Display for TimelineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The database system identifier: chosen at `init`, shared by a primary and all its standbys,
/// and shown in decimal as PostgreSQL's IDENTIFY_SYSTEM does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SystemId(pub u64);

impl fmt::Display for SystemId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for SystemId {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<SystemId, Self::Err> {
        s.parse().map(SystemId)
    }
}

// The system identifier is a u64 that JSON consumers (JavaScript among them) cannot hold
// exactly as a number, so it is stored and shown as a decimal string, as PostgreSQL shows it.
impl Serialize for SystemId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SystemId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SystemId, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// PostgreSQL's NAMEDATALEN - 1: a replication slot name is at most 63 bytes.
pub const MAX_SLOT_NAME_LEN: usize = 63;

/// Why a name is not a valid replication slot name. The texts are PostgreSQL's, to follow
/// `replication slot name "NAME" `.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SlotNameError {
    #[error("is too short")]
    TooShort,
    #[error("is too long")]
    TooLong,
    #[error("contains invalid character")]
    InvalidCharacter,
}

/// PostgreSQL's `ReplicationSlotValidateName`: `[a-z0-9_]{1,63}`, checked in its order (length,
/// then characters).
pub fn validate_slot_name(name: &str) -> Result<(), SlotNameError> {
    if name.is_empty() {
        return Err(SlotNameError::TooShort);
    }
    if name.len() > MAX_SLOT_NAME_LEN {
        return Err(SlotNameError::TooLong);
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(SlotNameError::InvalidCharacter);
    }
    Ok(())
}

/// Seconds between the Unix epoch and PostgreSQL's epoch, 2000-01-01 00:00:00 UTC.
const PG_EPOCH_UNIX_SECS: u64 = 946_684_800;

/// PostgreSQL's `TimestampTz` as sent on the wire: microseconds since 2000-01-01 00:00:00 UTC.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PgTimestamp(pub i64);

impl PgTimestamp {
    pub fn now() -> PgTimestamp {
        PgTimestamp::from_system_time(SystemTime::now())
    }

    pub fn from_system_time(t: SystemTime) -> PgTimestamp {
        let pg_epoch = UNIX_EPOCH + Duration::from_secs(PG_EPOCH_UNIX_SECS);
        match t.duration_since(pg_epoch) {
            Ok(d) => PgTimestamp(d.as_micros() as i64),
            Err(e) => PgTimestamp(-(e.duration().as_micros() as i64)),
        }
    }

    pub fn to_system_time(self) -> SystemTime {
        let pg_epoch = UNIX_EPOCH + Duration::from_secs(PG_EPOCH_UNIX_SECS);
        if self.0 >= 0 {
            pg_epoch + Duration::from_micros(self.0 as u64)
        } else {
            pg_epoch - Duration::from_micros(self.0.unsigned_abs())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lsn_text_matches_postgres() {
        let check = |lsn: u64, text: &str| {
            assert_eq!(Lsn(lsn).to_string(), text);
            assert_eq!(text.parse::<Lsn>().unwrap(), Lsn(lsn));
        };
        check(0, "0/0");
        check(0x0100_0000, "0/1000000");
        check(0x4025A50, "0/4025A50");
        check(0x1_0000_0060, "1/60");
        check(u64::MAX, "FFFFFFFF/FFFFFFFF");
    }

    #[test]
    fn lsn_parse_accepts_padded_and_lower_case() {
        assert_eq!("0/01000000".parse::<Lsn>().unwrap(), Lsn(0x0100_0000));
        assert_eq!(
            "00000001/0000abcd".parse::<Lsn>().unwrap(),
            Lsn(0x1_0000_abcd)
        );
    }

    #[test]
    fn lsn_parse_rejects_malformed() {
        for bad in [
            "",
            "0",
            "/1",
            "1/",
            "0/1/2",
            "g/1",
            "0/123456789",
            " 0/1",
            "-1/0",
            "+1/0",
        ] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn lsn_addition_never_wraps() {
        assert_eq!(Lsn(0x100_0000) + 0x18, Lsn(0x100_0018));
        assert_eq!(Lsn(u64::MAX - 1) + 1, Lsn::MAX);
        assert_eq!(Lsn(u64::MAX - 1).checked_add(1), Some(Lsn::MAX));
        assert_eq!(Lsn::MAX.checked_add(1), None);
        assert_eq!(Lsn(u64::MAX - 7).checked_add(u64::MAX), None);
    }

    #[test]
    #[should_panic(expected = "LSN overflow: FFFFFFFF/FFFFFFFF + 1")]
    fn lsn_addition_past_the_end_panics() {
        let _ = Lsn::MAX + 1;
    }

    #[test]
    fn lsn_segments() {
        let seg = 16 << 20;
        let lsn = Lsn(0x4025A50);
        assert_eq!(lsn.segment_number(seg), 4);
        assert_eq!(lsn.segment_start(seg), Lsn(0x4000000));
        assert_eq!(lsn.segment_offset(seg), 0x25A50);
    }

    #[test]
    fn slot_names_follow_postgres() {
        for ok in ["a", "pg_walreceiver_42", "0", &"x".repeat(63)] {
            assert_eq!(validate_slot_name(ok), Ok(()), "{ok}");
        }
        assert_eq!(validate_slot_name(""), Err(SlotNameError::TooShort));
        assert_eq!(
            validate_slot_name(&"x".repeat(64)),
            Err(SlotNameError::TooLong)
        );
        // Length is checked before characters, as PostgreSQL does.
        assert_eq!(
            validate_slot_name(&"X".repeat(64)),
            Err(SlotNameError::TooLong)
        );
        for bad in ["A", "has-dash", "dot.", "sp ace", "é"] {
            assert_eq!(
                validate_slot_name(bad),
                Err(SlotNameError::InvalidCharacter),
                "{bad}"
            );
        }
        assert_eq!(
            SlotNameError::InvalidCharacter.to_string(),
            "contains invalid character"
        );
    }

    #[test]
    fn timestamp_epoch() {
        let t = UNIX_EPOCH + Duration::from_secs(PG_EPOCH_UNIX_SECS) + Duration::from_micros(7);
        assert_eq!(PgTimestamp::from_system_time(t), PgTimestamp(7));
        assert_eq!(PgTimestamp(7).to_system_time(), t);
        // The sendTime seen in the captures (about 2026-11-30) lies in the expected decade.
        let observed = PgTimestamp(849_331_599_209_587).to_system_time();
        let secs = observed.duration_since(UNIX_EPOCH).unwrap().as_secs();
        assert!((1_790_000_000..1_800_000_000).contains(&secs), "{secs}");
    }

    #[test]
    fn json_forms() {
        let id = SystemId(7_000_000_000_000_000_001);
        assert_eq!(
            serde_json::to_string(&id).unwrap(),
            "\"7000000000000000001\""
        );
        assert_eq!(
            serde_json::from_str::<SystemId>("\"42\"").unwrap(),
            SystemId(42)
        );
        assert_eq!(
            serde_json::to_string(&Lsn(0x1_0000_0060)).unwrap(),
            "\"1/60\""
        );
        assert!(serde_json::from_str::<Lsn>("\"zz\"").is_err());
    }

    proptest! {
        #[test]
        fn lsn_roundtrip(v: u64) {
            let lsn = Lsn(v);
            prop_assert_eq!(lsn.to_string().parse::<Lsn>().unwrap(), lsn);
            let padded = format!("{:X}/{:08X}", v >> 32, v as u32);
            prop_assert_eq!(padded.parse::<Lsn>().unwrap(), lsn);
        }
    }
}
