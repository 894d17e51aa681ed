//! supervisor-actor: a walserver node's actors and their lifecycle.
//!
//! [`NodeBuilder`] starts a node inside the caller's actix System: it opens the data
//! directory, starts the walsender registry and the replication listener (with walsenders on
//! a few arbiters), and the [`Supervisor`] that owns them. The supervisor replaces the
//! postmaster's signals with messages: it is told to shut down ([`ShutdownNode`]) and does so
//! in order (stop accepting, drain walsenders with their deadline, then let storage go), and
//! it answers status queries ([`GetNodeStatus`]).
//!
//! It never touches bytes of the protocol and never polls: children report to it with
//! messages. The walreceiver and its restart policy join it with the standby issue.

mod append;
mod node;

pub use append::{AppendError, AppendRecords, Appended, Durability};

pub use node::{
    GetNodeStatus, Node, NodeBuilder, NodeConfig, NodeError, NodeRole, NodeStatus, ShutdownNode,
    Supervisor,
};
pub use walsender_actor::session::ShutdownMode;
