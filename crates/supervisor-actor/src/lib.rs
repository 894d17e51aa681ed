//! supervisor-actor: a walserver node's actors and their lifecycle.
//!
//! [`NodeBuilder`] starts a node inside the caller's actix System: it makes the data directory
//! on a first start ([`datadir`]: a primary's, or a standby's from its upstream), opens it,
//! starts the walsender registry and the replication listener (walsenders on a few
//! arbiters), a walreceiver on a standby, and the [`Supervisor`] that owns them. The
//! supervisor replaces the postmaster's signals with messages and state:
//!
//! - a request to run the walreceiver is state kept until one runs, never an edge that can be
//!   lost; a child's start and stop arrive as messages carrying its id and the reason, so a
//!   late event of a replaced walreceiver is recognised and a surplus start is harmless;
//! - the restart policy is data ([`RestartPolicy`]): the first retry at once, then backoff
//!   with jitter to a cap (`wal_retrieve_retry_interval`), reset after a stable period; its
//!   schedule and state are in `/status`, and a run of failures is logged by its first
//!   failure and a summary at a bounded rate, never one line per attempt;
//! - shutdown goes in order: stop accepting, drain walsenders with their deadline, stop the
//!   walreceiver, stop the services handed to it ([`SuperviseService`]: walserver's admin
//!   API), release storage;
//! - promotion stops the walreceiver, starts the next timeline and makes the node a primary;
//! - under the overlapped commit (`synchronous_commit_overlap`) a primary never resumes a
//!   timeline on which it may have sent a synchronous standby WAL it then lost (rule 5,
//!   `walsender_actor::overlap::starts_new_timeline`, from storage's durable early-send mark,
//!   written before the first early send on a timeline): [`NodeBuilder`] starts a new one at
//!   the durable end before the listener exists when the mark names the timeline, unless
//!   the last shutdown was clean (storage's clean-shutdown mark, written at `ShutdownNode`
//!   after the last flush and taken at every start with the early-send mark,
//!   `Wal::take_clean_shutdown_mark`); under a failover actor the term it takes up brings the
//!   new timeline instead ([`PromoteForTerm`] on a primary), and a reopening of failed
//!   storage (which drops what was written after the last good sync) brings one too, with
//!   appends refused and the walsenders held until it is made;
//! - a failover actor acts on the node only through the leadership messages: [`PromoteForTerm`]
//!   (a promotion whose history reason names the term), [`FollowLeader`] (a standby
//!   re-targets its walreceiver at once; a primary is demoted live: its fence closes, its
//!   walsender sessions end and new ones wait, its WAL beyond the leader's fork is dropped
//!   ([`fork`], shared with `walserver rejoin`; counted with rule 4's cuts, and refused
//!   below the commit point the node was told when the leader was chosen in a synchronous
//!   mode, elsewhere lowering that point to the fork), and it streams from the leader),
//!   [`SetSyncStandbys`], [`EnsureMemberSlots`] / [`DropMemberSlots`] (the physical slots
//!   a leader keeps for the other members, made or dropped on a blocking thread), and
//!   [`SyncPermanentSlots`] (the cluster's permanent slots: made on the leader, copied with
//!   their positions on the standbys);
//! - storage's failures are events on its health watch: after a failed sync the supervisor
//!   reopens storage ([`wal_storage::Wal::restart`]) on a backoff schedule of the restart
//!   policy until it succeeds, starts no walreceiver meanwhile, and starts one at once when
//!   storage is back; a full disk needs no restart (a standby's walreceiver retries on a
//!   short backoff capped at `disk_full_cap`).
//!
//! Whether it may acknowledge an append is its [`Fence`]'s answer: open (always) without
//! automatic failover; under a failover actor, closed until the actor grants it a deadline
//! while it holds the cluster's leadership. An append is refused before anything is written
//! while the fence is closed ([`AppendError::NotLeader`]), and one that became durable here
//! after the fence closed, even while it waited for synchronous standbys, is answered
//! [`AppendError::Indeterminate`]: durable here, not acknowledged.
//!
//! Readers see only acknowledged WAL ([`Node::acknowledged`]): on a primary with synchronous
//! standbys and a synchronous `synchronous_commit`, [`Node::records`] ends where the standbys
//! confirmed (the registry publishes what they confirmed), not at the local flush, and after a
//! restart it shows nothing past the start until they confirm again; elsewhere the local flush
//! is the end.
//!
//! It publishes what it is doing at each change, as a watch ([`Node::state`]: its role and
//! whether its walreceiver streams), so that whoever shows it (the failover actor's member
//! key, `/replica`) follows the change at once instead of asking again. `/status`'s
//! `failover` part ([`FailoverStatus`]) is a type of this crate, which the admin API fills in
//! from the failover actor; the supervisor leaves it empty.
//!
//! It counts the appends it answers, by durability level, with their latency and their wait
//! for synchronous standbys ([`AppendMetrics`], shared as [`Node::append_metrics`]).
//!
//! Its peers are whoever embeds the node (the `walserver` binary or an application), which
//! talks to it with messages, and its children: the walsender registry and the walreceiver,
//! which report to it with messages. It stops on [`ShutdownNode`] (the binary sends it on a
//! signal), after the ordered shutdown above; `immediate` ends every walsender at once
//! instead of draining. A walreceiver's failure does not stop it: the restart policy starts
//! another.
//!
//! It never touches the protocol's bytes and never polls: children report with messages,
//! storage and the fence with watches. Its timers are backoffs and real timeouts, four in all:
//! the walreceiver's retry after a stop, on the restart policy's schedule; the reopening of
//! failed storage, on the same policy; an append's wait for its synchronous standbys, bounded
//! by `synchronous_wait_timeout`; and the fence's grant, whose deadline passing closes it, so
//! that appends waiting then end indeterminate and the role it publishes changes. The drain's
//! deadline at shutdown is handed to the walsenders, which keep it. It does not depend on
//! `protocol-codec`: what it needs of the protocol (the shutdown modes, the `SHOW` values)
//! comes through the actor crates.
//!
//! # Layout
//!
//! The actor, [`Supervisor`], is `supervisor/mod.rs` (its lifecycle, the walreceiver's start
//! requests, shutdown, status, promotion), with one file per further concern beside it:
//! appends, leadership (the failover actor's messages), storage's health.
//! Every message it takes, with its result type, is in `messages`; what `/status` shows in
//! `status`; the durability levels in `durability` and their counts in `append_metrics`.
//!
//! The errors are four enums in `error`, not the one per crate the house keeps elsewhere,
//! because each is the answer of one request to its own audience and its callers match on its
//! variants: [`AppendError`] (an HTTP status and a client's retry hang on each variant, two of
//! them indeterminate outcomes), [`PromoteError`], [`FollowError`] (the failover actor retries
//! on [`FollowError::NoSlot`]) and [`NodeError`] (why a node did not start, for the operator).
//! One enum for all would make each caller handle variants its request cannot produce.
//!
//! # Embedding
//!
//! An actix application starts a node inside its own System and talks to it with messages:
//! append records with a durability level, read them back in LSN order, wait for an LSN.
//! [`NodeBuilder::primary`] makes the data directory on the first start;
//! [`NodeBuilder::standby`] makes a standby's from its upstream.
//!
//! ```
//! use bytes::Bytes;
//! use futures_util::StreamExt;
//! use supervisor_actor::{AppendRecords, Durability, Follow, NodeBuilder, RecordEvent, ShutdownNode};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! actix_rt::System::new().block_on(async {
//!     // Replication clients may connect on `node.listen_addr`.
//!     let node = NodeBuilder::primary(dir.path().join("data"))
//!         .listen("127.0.0.1:0".parse()?)
//!         .segment_size(1 << 20)
//!         .start()
//!         .await?;
//!
//!     let from = node.wal.flushed();
//!     let appended = node
//!         .supervisor
//!         .send(AppendRecords { records: vec![Bytes::from("hello")], durability: Some(Durability::Local) })
//!         .await??;
//!
//!     let mut records = Box::pin(node.records(from, Follow::UntilCurrentEnd));
//!     match records.next().await {
//!         Some(Ok(RecordEvent::Record { payload, end, .. })) => {
//!             assert_eq!(payload, "hello");
//!             assert_eq!(end, appended.end_lsn);
//!         }
//!         other => panic!("{other:?}"),
//!     }
//!     node.supervisor.send(ShutdownNode { immediate: false }).await?;
//!     Ok(())
//! })
//! # }
//! ```

mod append_metrics;
mod builder;
pub mod datadir;
mod durability;
mod error;
mod fence;
pub mod fork;
mod messages;
mod node;
mod records;
mod restart;
mod status;
mod supervisor;
mod visibility;

pub use append_metrics::{AppendCounts, AppendMetrics};
pub use builder::NodeBuilder;
pub use durability::{Durability, SyncSettings};
pub use error::{AppendError, FollowError, NodeError, PromoteError};
pub use fence::{Fence, FenceView};
pub use messages::{
    AppendRecords, Appended, DropMemberSlots, EnsureMemberSlots, FollowLeader, Followed,
    GetNodeStatus, MemberSlots, PermanentSlots, Promote, PromoteForTerm, Promoted, Reconfigure,
    ReportApplied, SetSyncStandbys, ShutdownNode, SuperviseService, SyncPermanentSlots,
};
pub use node::{LocalLevel, Node, NodeConfig, DEFAULT_LISTEN};
pub use records::{
    check_records_start, subscribe_records, Follow, RecordEvent, RecordsFrom, RecordsStart,
};
pub use restart::{FailureLog, RestartPolicy, RestartState, RetrySchedule};
pub use status::{
    CommitStatus, FailoverStatus, MembershipState, NodeRole, NodeState, NodeStatus, ServiceInfo,
    ServiceState, WalReceiverInfo,
};
pub use supervisor::Supervisor;
pub use walsender_actor::session::ShutdownMode;
