//! failover-actor: automatic failover of walserver nodes on etcd.
//!
//! One [`FailoverActor`] runs beside each node under failover (whose fence starts
//! [`supervisor_actor::Fence::closed`]). It keeps the node's membership and leadership in etcd
//! and tells the node's supervisor what to do; it never acts on the node itself.
//!
//! What it owns:
//! - The keys under `/walserver/<cluster>/` ([`keys`]): `leader` (the leader's name, on its
//!   lease, created only when absent, so its create revision is the term), `members/<name>`
//!   ([`MemberInfo`] JSON on the member's own lease, refreshed at each renewal, created only
//!   when absent and else written only while on that lease: one process per member name;
//!   [`check_member_name`] refuses a second one before its node starts, and a member that
//!   finds its key on another lease stops acknowledging and leaves failover), `sync`
//!   (`{leader, sync_standby, term}`), `pause`, `switchover` (`{from, to, force}`, on the
//!   leader's lease), `history/<term>` ([`TermRecord`], on no lease), `slots/<name>` (a
//!   permanent slot, on no lease: named by an operator, its position written by the leader).
//! - Membership and election. One lease per node (the configured ttl), renewed every ttl/3;
//!   one watch on the prefix, so that a deleted leader key (an expired lease, a handover) makes
//!   the eligible standbys campaign at once. The decisions are a plain state machine
//!   ([`machine`], unit-tested): who may campaign (not `nofailover`, priority > 0, not
//!   paused; asynchronous mode: within `maximum_lag_on_failover` of the last leader's
//!   published position and no live peer more advanced by its admin API's `GET /status`,
//!   ties to the primary, then priority, then name; synchronous mode: only the member `sync`
//!   names; at bootstrap only a primary), and what a node does on what it sees: lead (promote
//!   with `PromoteForTerm` if it is a standby or runs the overlapped commit, whose rule 5
//!   gives every term a new timeline; record the term, grant the fence), follow the
//!   member the leader key names (`FollowLeader` with that member's conninfo, its own name as
//!   `application_name`, and the archive, so that a member behind what the new leader keeps
//!   fills the gap from it, and in a synchronous mode `synchronous`, so that a fork below
//!   the commit point it was told is refused; an older term is refused), or drop the fence.
//! - Whether this node is a member at all ([`GetFailoverStatus`], `membership.rs`): never
//!   silently outside the cluster. Until its first join, while etcd is out of reach, once its
//!   lease has gone a ttl without a renewal, and after its name was taken, it is not a
//!   member; [`GetLocalHealth`] says why (the admin API's `/primary` and `/replica` then
//!   answer 503 with the reason), and the log says it once, then at most one summary a
//!   minute per kind of failure (joining, renewing, watching; `outage.rs`, the walreceiver's
//!   way), and the return once.
//! - Its member key follows the node: each change of the node's role or streaming (the
//!   supervisor's `Node::state` watch) publishes the key at once, not at the next renewal,
//!   so that the other members' views and candidates read the truth within milliseconds.
//!   [`GetClusterView`] adds what etcd's keys cannot say: the members whose key went while
//!   this one watched (kept as departed for the member slot grace, as long as a leader keeps
//!   their slots), whether the leader's lease is still being renewed, and whether its admin
//!   API answers.
//! - The fencing deadline. The leader confirms each renewal with a transaction comparing the
//!   leader key's value and lease (a keepalive's answer alone proves nothing: etcd 3.4 could
//!   renew a revoked lease) and only then grants the fence until the instant the renewal was
//!   sent, plus the ttl, minus a margin ([`machine::fence_deadline`]). A failed confirmation
//!   revokes the fence at once; a failed renewal is retried quickly, and the fence closes by
//!   its own deadline if none succeeds, before any successor can have been elected.
//! - The synchronous standby's publication (`synchronous_mode` on or strict), in a loss-free
//!   order ([`machine::plan_sync`]): a standby counts for acknowledgements before it is
//!   published, is published only once it has what the leader had flushed when it began to
//!   count, and the one it replaces stops counting only after that; losing the only one
//!   unpublishes first (`on`) or keeps appends waiting (`strict`).
//! - Member slots (`use_slots`, on by default, as Patroni's): the leader holds a physical
//!   replication slot for every other member ([`member_slot_name`]: `walserver_member_` and
//!   the name, one injective mapping), for those with a key and those whose key went less
//!   than a grace ago (10 ttl by default; the crashed leader's key goes with its lease). It
//!   makes them right after its promotion and before its fence is granted, so before any
//!   append can reach a segment switch (where retention removes WAL), and again whenever a
//!   member appears; a slot whose member has been gone longer than the grace is dropped at
//!   the grace's end, so a removed member does not fill the disk (`max_slot_wal_keep_size`
//!   bounds every slot meanwhile). Members follow through their slot (`primary_slot_name`),
//!   so that the WAL one behind or down still needs stays even with `wal_keep_size` 0. A
//!   follower drops the member slots it holds (every member streams from the leader, so they
//!   would only keep WAL on a standby). Only slots with the prefix are touched;
//!   [`SubscribeMemberSlots`] watches the ones held.
//! - Permanent slots (`permanent.rs`, as Patroni's `slots:`): the slots named under `slots/`
//!   ([`AddPermanentSlot`], [`RemovePermanentSlot`]) exist on whichever member leads. The
//!   leader makes those it lacks before its fence is granted (a slot of that name a client
//!   made is the same slot) and writes each one's position into its key whenever storage
//!   says the slot entered another segment; every standby keeps a copy at that position, so
//!   its retention keeps what the slot's client still needs, and when it leads the copy is
//!   the slot. A name removed is dropped on every member that sees the removal.
//! - Handovers: [`Switchover`] (zero loss: the leader stops acknowledging, waits for the
//!   candidate to have everything it flushed, writes `switchover` and deletes its key in a
//!   transaction guarded by value and lease; only the candidate campaigns) and [`Failover`]
//!   (forced, no wait; the report says how far behind the candidate was). Either may be sent
//!   to any member: it goes to the leader through the `switchover` key.
//!
//! What it does not own: the node (promotion, demotion with its divergent tail cut back,
//! which standbys' acknowledgements count, the fence's check before an answer are the
//! supervisor's); consensus (etcd's; this crate has none of its own); etcd's wire format,
//! TLS and auth token (`etcd-gateway`, whose client [`FailoverConfig::etcd_client`] makes
//! from the configuration's endpoints and `etcd_security`).
//!
//! It acts on the node only through the supervisor. Three reads go around it, and they are
//! the only ones; none changes anything on the node:
//! - Storage's in-memory position, through the node's `Wal` handle (no file I/O, no wait): the
//!   flushed end at the instant a handover revokes the fence, read in the same handler with
//!   no wait between, so that it bounds every acknowledged append (a status from the
//!   supervisor would come a message later); and where the current timeline starts, when a
//!   node that is already a primary takes up a term (the history's record), which the
//!   supervisor's status does not carry.
//! - Storage's slot changes ([`wal_storage::Wal::slot_moves`], a watch): the event that a
//!   leader's permanent slot moved, which happens in a walsender, not in the supervisor.
//! - The walsender registry's synchronous wait (`WaitForSync`), for a first synchronous
//!   standby catching up: an event that the supervisor has no message for, the same wait an
//!   append makes; a supervisor message that only passed it on would add a hop and nothing
//!   else.
//!
//! Its peers: etcd, through `etcd-gateway` (every call a future on the actor's arbiter, under
//! a deadline of a third of the ttl); the node's supervisor (messages `PromoteForTerm`,
//! `FollowLeader`, `SetSyncStandbys`, `EnsureMemberSlots`, `DropMemberSlots`,
//! `SyncPermanentSlots`, `GetNodeStatus`; the fence it shares with it; its `Node::state`
//! watch); the other members' admin API (`GET /status`, before campaigning); and whoever
//! embeds it (the binary's admin API, tests), through [`GetClusterView`], [`GetLocalHealth`],
//! [`GetFailoverStatus`], [`GetHistory`], [`Pause`], [`Resume`], the permanent slots'
//! messages, the handovers and [`SubscribeLeadership`] (a watch of what this node does, for
//! waiting on a change rather than asking again).
//!
//! How it stops: [`StopFailover`] closes the fence first and, with `release`, revokes the
//! lease, so that the leader key and the member key go at once and a successor need not wait
//! the ttl; an actor that simply stops closes the fence. On etcd errors it keeps retrying with
//! a bounded backoff (joining, renewing, watching again); meanwhile the fence's deadline
//! protects the appends. A member whose name another process took does not stop: it closes
//! its fence, gives up its lease and stays, out of failover, to say so until the node stops. A supervisor that does not answer leaves the last status to decide on.
//!
//! Its timers are real timeouts and backoffs only: the renewal schedule, retries, the
//! candidate's catch-up bound, the end of a departed member's slot grace. Every event (a key
//! changed, a leader elected) comes from the watch; a slot's move, from storage's. Its constants are guesses and say so.
//!
//! How it is built: the actor's state is a few small structs (the lease, the decisions, the
//! synchronous standby, the member slots, the permanent slots, the handover); the
//! reconciliation, the two slot rounds and the synchronous standby's round each run one at a
//! time through one type, `round.rs`'s `Rounds`. Each long flow (taking up a term, a synchronous standby's change, a handover)
//! is one future that does its work against etcd and the supervisor and returns to the
//! actor's state once, with its commit point written beside it; the decisions are
//! [`machine`]'s pure functions.

mod actor;
mod admin;
mod config;
mod error;
mod handover;
pub mod keys;
pub mod machine;
mod membership;
mod messages;
mod outage;
mod peers;
mod permanent;
mod reconcile;
mod round;
mod slot_names;
mod slots;
mod store;
mod sync;
mod view;

pub use actor::FailoverActor;
pub use config::{
    FailoverConfig, SynchronousMode, DEFAULT_MAXIMUM_LAG_ON_FAILOVER,
    DEFAULT_MEMBER_SLOT_GRACE_TTLS, DEFAULT_TTL,
};
pub use error::FailoverError;
pub use messages::{
    AddPermanentSlot, Failover, FailoverMetrics, GetClusterView, GetFailoverMetrics,
    GetFailoverStatus, GetHistory, GetLocalHealth, Leadership, Pause, RemovePermanentSlot, Resume,
    StopFailover, SubscribeLeadership, SubscribeMemberSlots, Switchover, SwitchoverReport,
};
pub use permanent::check_permanent_slot_name;
pub use slot_names::{member_slot_name, slot_member, MEMBER_SLOT_PREFIX};
pub use store::check_member_name;
pub use view::{ClusterView, DepartedMember, LeaderView, LocalHealth, MemberInfo, TermRecord};
