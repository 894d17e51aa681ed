//! supervisor-actor: a walserver node's actors and their lifecycle.
//!
//! [`NodeBuilder`] starts a node inside the caller's actix System: it opens the data
//! directory, starts the walsender registry and the replication listener (walsenders on a few
//! arbiters), a walreceiver on a standby, and the [`Supervisor`] that owns them. The
//! supervisor replaces the postmaster's signals with messages and state:
//!
//! - a request to run the walreceiver is state kept until one runs, never an edge that can be
//!   lost; a child's start and stop arrive as messages carrying its id and the reason, so a
//!   late event of a replaced walreceiver is recognised and a surplus start is harmless;
//! - the restart policy is data ([`RestartPolicy`]): the first retry at once, then backoff
//!   with jitter to a cap, reset after a stable period; its state is in `/status`;
//! - shutdown goes in order: stop accepting, drain walsenders with their deadline, stop the
//!   walreceiver, release storage;
//! - promotion stops the walreceiver, starts the next timeline and makes the node a primary.
//!
//! It never touches the protocol's bytes and never polls: children report with messages, and
//! its only timers are the restart policy's backoff.

mod append;
mod node;
mod records;
mod restart;
mod supervisor;

pub use append::{AppendError, AppendRecords, Appended, Durability, SyncSettings};
pub use node::{LocalLevel, Node, NodeBuilder, NodeConfig, NodeError};
pub use records::{subscribe_records, Follow, RecordEvent};
pub use restart::{RestartPolicy, RestartState};
pub use supervisor::{
    GetNodeStatus, NodeRole, NodeStatus, Promote, PromoteError, Promoted, Reconfigure,
    ReportApplied, ShutdownNode, Supervisor, WalReceiverInfo,
};
pub use walsender_actor::session::ShutdownMode;
