//! The actix messages of supervisor-actor, by who sends them. Commands are imperatives; each
//! has an explicit result type, written beside it (the errors are in [`crate::error`], the
//! status in [`crate::status`]).
//!
//! From whoever embeds the node (the `walserver` binary, an application): [`AppendRecords`],
//! [`ShutdownNode`], [`GetNodeStatus`], [`Promote`], [`Reconfigure`], [`ReportApplied`] and
//! [`SuperviseService`]. From a failover actor, which decides while the supervisor stays the
//! only one that acts on the node: [`PromoteForTerm`], [`FollowLeader`], [`SetSyncStandbys`],
//! [`EnsureMemberSlots`], [`DropMemberSlots`] and [`SyncPermanentSlots`]. From the supervisor
//! to itself:
//! `ShutdownDone`.

use actix::prelude::*;
use bytes::Bytes;
use serde::Serialize;
use wal_storage::{Lsn, TimelineId, WalError};
use walreceiver_actor::ReceiverConfig;
use walsender_actor::syncrep::SyncStandbyNames;
use walsender_actor::WalSenderSettings;

use crate::durability::{Durability, SyncSettings};
use crate::error::{AppendError, FollowError, PromoteError};
use crate::status::NodeStatus;

/// Append records; answered with their end LSNs once `durability` holds (the node's
/// `synchronous_commit` when `None`).
#[derive(Message, Debug)]
#[rtype(result = "Result<Appended, AppendError>")]
pub struct AppendRecords {
    pub records: Vec<Bytes>,
    pub durability: Option<Durability>,
}

/// Where appended records ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Appended {
    /// The end of the last record: wait for this LSN to read your writes elsewhere.
    pub end_lsn: Lsn,
    /// The end of each record, in order.
    pub record_ends: Vec<Lsn>,
    pub timeline: TimelineId,
    pub durability: Durability,
}

/// Shut the node down: stop accepting, end the walsenders as `immediate` says (a fast
/// shutdown waits up to `wal_sender_shutdown_timeout` for standbys to confirm), stop the
/// walreceiver, then release storage. Answered when done; a second, immediate request while
/// a fast one runs reaches the walsenders still draining.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ShutdownNode {
    pub immediate: bool,
}

/// The node's status, as `/status` shows it.
#[derive(Message)]
#[rtype(result = "Result<NodeStatus, MailboxError>")]
pub struct GetNodeStatus;

/// Promote a standby of walserver records: stop the walreceiver, start the next timeline at
/// the end of flushed WAL (its history file made durable), take appends.
#[derive(Message)]
#[rtype(result = "Result<Promoted, PromoteError>")]
pub struct Promote;

/// Where a promotion started the new timeline.
#[derive(Clone, Debug, Serialize)]
pub struct Promoted {
    pub timeline: TimelineId,
    pub switch_lsn: Lsn,
}

/// New settings from a reload: applied without a restart.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Reconfigure {
    pub walsender: WalSenderSettings,
    pub max_wal_senders: usize,
    /// The walreceiver's configuration; a change restarts the walreceiver at once.
    pub receiver: Option<ReceiverConfig>,
    /// Synchronous replication; waiting appends the new setting satisfies are released.
    pub sync: SyncSettings,
}

/// An application on a standby applied WAL up to `lsn` (reported upstream as apply).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReportApplied {
    pub lsn: Lsn,
}

/// A service that runs beside the node, handed to its supervisor so that it stops in the
/// node's shutdown order and its end, with the reason, is known: walserver's admin API. The
/// supervisor stops it after the walsenders and the walreceiver (so it can answer while they
/// drain) and before storage is released. A service that ends on its own is logged, with why,
/// and shown in status; the node goes on replicating.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SuperviseService {
    pub name: String,
    /// Resolves when the service has ended: `Err` with the reason if it failed.
    pub ended: futures_util::future::BoxFuture<'static, Result<(), String>>,
    /// Stops the service; resolves once it has stopped.
    pub stop: Box<dyn FnOnce() -> futures_util::future::BoxFuture<'static, ()> + Send>,
}

/// Promote this standby as the leader of `term`: as [`Promote`](crate::Promote), with the
/// term recorded beside the new timeline in its history, so that the timeline history is also
/// the history of leadership. Under the overlapped commit a primary takes it too: one whose
/// early-send mark names its timeline starts a new timeline at its durable end (rule 5: it
/// never resumes a timeline a standby may hold more of), any other takes the term up on its
/// timeline (answering where that timeline starts) and decides the commit point from then;
/// with the switch off a primary is refused with [`PromoteError::NotStandby`].
#[derive(Message, Clone, Copy, Debug)]
#[rtype(result = "Result<Promoted, PromoteError>")]
pub struct PromoteForTerm {
    pub term: u64,
}

/// Follow the leader of `term` at `upstream`. A standby re-targets its walreceiver at once
/// (no reconnect delay). A primary is demoted live: it stops taking appends, drops its WAL
/// beyond the point where the leader's history forked from it (saying how much), becomes a
/// standby of the leader and streams from it. A standby whose WAL went past the fork is cut
/// back the same way.
#[derive(Message, Clone, Debug)]
#[rtype(result = "Result<Followed, FollowError>")]
pub struct FollowLeader {
    pub upstream: ReceiverConfig,
    pub term: u64,
    /// The leader was chosen to hold everything acknowledged (a synchronous mode): a fork
    /// below the commit point this node was told says it does not, and following is refused
    /// ([`crate::fork::forks_below_commit_point`]).
    pub synchronous: bool,
}

/// What following a leader did.
#[derive(Clone, Debug, Serialize)]
pub struct Followed {
    /// The node was a primary and is now a standby.
    pub demoted: bool,
    /// Where the leader's history forked from this node's, if it did.
    pub fork: Option<Lsn>,
    /// Bytes of WAL beyond the fork that were dropped.
    pub dropped_bytes: u64,
    /// The node's timeline after following.
    pub timeline: TimelineId,
}

/// Which standbys' acknowledgements count for synchronous appends from now on: set by a
/// failover actor in `synchronous_mode` after it has published the choice, so that only a
/// standby named in the cluster's store before its acknowledgements counted can be promoted.
/// `None` makes appends asynchronous (waiting appends are released).
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct SetSyncStandbys {
    pub names: Option<SyncStandbyNames>,
}

/// Makes sure this node holds a physical replication slot by each of `names` (made
/// persistent, reserving WAL from the flushed end, as PostgreSQL's
/// `pg_create_physical_replication_slot(name, true)`): the slots a leader keeps for the other
/// members, so that the WAL a member has not received yet stays while it is behind or down.
/// Existing slots are left as they are. The answer says which were made, and lists every slot
/// whose name starts with `prefix` afterwards (the slots of this kind the node holds).
#[derive(Message, Clone, Debug)]
#[rtype(result = "Result<MemberSlots, WalError>")]
pub struct EnsureMemberSlots {
    pub names: Vec<String>,
    pub prefix: String,
}

/// Drops the slots named `names` that exist and are not in use (a slot a walsender streams
/// through is left, and said so in the log; the caller asks again later). The answer says
/// which were dropped, and lists every slot whose name starts with `prefix` afterwards.
#[derive(Message, Clone, Debug)]
#[rtype(result = "Result<MemberSlots, WalError>")]
pub struct DropMemberSlots {
    pub names: Vec<String>,
    pub prefix: String,
}

/// What [`EnsureMemberSlots`] or [`DropMemberSlots`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemberSlots {
    /// The slots made (ensuring) or dropped (dropping).
    pub changed: Vec<String>,
    /// Every slot with the prefix the node holds afterwards, sorted.
    pub held: Vec<String>,
}

/// Makes this node's slots of the cluster's permanent slots agree with `slots` (each name with
/// the position the cluster knows for it, if any), and drops those of `drop` (names no longer
/// permanent; one in use is left, and said so in the log). A missing slot is made, persistent:
/// at the position given (taken as the flushed end if beyond it); with no position, from the
/// flushed end on the leader (`follow` false, as PostgreSQL's
/// `pg_create_physical_replication_slot(name, true)`) and reserving nothing yet on a standby.
/// With `follow` (a standby), an existing slot is moved to the position given, so that its
/// copy holds what the leader's slot holds; the leader's own slots are left where its clients
/// put them. The answer gives every slot of `slots` the node holds afterwards, with its
/// position.
#[derive(Message, Clone, Debug)]
#[rtype(result = "Result<PermanentSlots, WalError>")]
pub struct SyncPermanentSlots {
    pub slots: Vec<(String, Option<Lsn>)>,
    pub drop: Vec<String>,
    pub follow: bool,
}

/// What [`SyncPermanentSlots`] did, and where the slots are now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PermanentSlots {
    pub made: Vec<String>,
    pub dropped: Vec<String>,
    /// Each permanent slot held, by name, with its restart point (`None`: reserves nothing).
    pub held: Vec<(String, Option<Lsn>)>,
}

/// The supervisor to itself: the ordered shutdown has finished its steps.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct ShutdownDone;
