//! A node's configuration ([`NodeConfig`], what [`crate::NodeBuilder`] fills in) and
//! [`Node`], the handles of a running node.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use wal_storage::{Lsn, StorageConfig, Wal, WalError};
use walreceiver_actor::ReceiverConfig;
use walsender_actor::{Shared, WalSenderRegistry, WalSenderSettings};

use crate::append_metrics::AppendMetrics;
use crate::durability::SyncSettings;
use crate::fence::Fence;
use crate::messages::ReportApplied;
use crate::records::{subscribe_acknowledged_records, Follow, RecordEvent};
use crate::restart::RestartPolicy;
use crate::status::NodeState;
use crate::supervisor::Supervisor;

/// Where the replication protocol listens unless told otherwise: PostgreSQL's port plus one,
/// so a node can run beside a PostgreSQL server, on loopback only.
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    5433,
));

/// Everything needed to start a node.
#[derive(Clone)]
pub struct NodeConfig {
    pub data_dir: PathBuf,
    /// Storage knobs; `segment_size` is taken from the data directory.
    pub storage: StorageConfig,
    /// Where the replication protocol listens (port 0 picks a free port).
    pub listen: SocketAddr,
    pub max_wal_senders: usize,
    pub walsender: WalSenderSettings,
    /// How long a fast shutdown waits for standbys to confirm what they were sent.
    pub wal_sender_shutdown_timeout: Duration,
    /// TLS for the replication port, if configured.
    pub tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    /// The tls-server-end-point data of `tls`'s certificate
    /// (`protocol_codec::tls::server_end_point`): with it SCRAM-SHA-256-PLUS is offered on TLS
    /// connections, as PostgreSQL offers it; without it only SCRAM-SHA-256.
    pub tls_channel_binding: Option<Vec<u8>>,
    /// Threads that host walsenders and the walreceiver; 0 keeps them on the caller's arbiter.
    pub io_threads: usize,
    /// `Some` makes the node a standby that streams from this upstream.
    pub standby: Option<ReceiverConfig>,
    pub restart_policy: RestartPolicy,
    /// The data directory's `standby.signal`, which holds a standby's upstream (whether the
    /// node is a standby is the role rule of `datadir`, with the control data's role);
    /// promotion removes it after its commit, and a start settles the role with it. `None`
    /// leaves both alone.
    pub standby_signal: Option<PathBuf>,
    /// Synchronous replication and the default durability of appends.
    pub sync: SyncSettings,
    /// Whether the node may acknowledge appends ([`Fence::open`] without automatic
    /// failover; a failover actor holds a clone of a closed one and grants it).
    pub fence: Fence,
}

impl NodeConfig {
    pub fn new(data_dir: impl Into<PathBuf>, listen: SocketAddr) -> NodeConfig {
        NodeConfig {
            data_dir: data_dir.into(),
            storage: StorageConfig::default(),
            listen,
            max_wal_senders: 10,
            walsender: WalSenderSettings::default(),
            // A guess: long enough for a healthy standby on a LAN to confirm a few MB, short
            // enough that a dead one does not hold a switchover for long.
            wal_sender_shutdown_timeout: Duration::from_secs(10),
            tls: None,
            tls_channel_binding: None,
            io_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            standby: None,
            restart_policy: RestartPolicy::default(),
            standby_signal: None,
            sync: SyncSettings::default(),
            fence: Fence::open(),
        }
    }
}

/// The handles of a running node.
#[derive(Clone)]
pub struct Node {
    pub supervisor: Addr<Supervisor>,
    pub registry: Addr<WalSenderRegistry>,
    pub shared: Arc<Shared>,
    pub wal: Wal,
    /// The replication listener's actual address.
    pub listen_addr: SocketAddr,
    /// Appends by durability level and their latencies, for `/metrics`.
    pub append_metrics: Arc<AppendMetrics>,
    /// The fence the supervisor asks before acknowledging an append; the failover actor
    /// grants and revokes it.
    pub fence: Fence,
    /// The end of the WAL acknowledged at the node's durability level (see
    /// [`Node::acknowledged`]).
    pub(crate) acknowledged: crate::visibility::Acknowledged,
    /// What this node's application has applied (see [`Node::report_applied`]).
    pub(crate) applied: Arc<tokio::sync::watch::Sender<Lsn>>,
    /// The supervisor's [`NodeState`], as it publishes each change.
    pub(crate) state: tokio::sync::watch::Receiver<NodeState>,
}

/// A position on this node that [`Node::wait_for_lsn`] can wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalLevel {
    /// Durable in this node's storage.
    Flushed,
    /// Applied by this node's application (reported with [`Node::report_applied`]).
    Applied,
}

impl Node {
    /// The node's walserver records from `from` (a record boundary or a segment start), in
    /// LSN order, across timeline switches, as they become acknowledged: durable here, and on
    /// a primary with synchronous standbys and a synchronous `synchronous_commit`, confirmed
    /// by them (see [`Node::acknowledged`]).
    pub fn records(
        &self,
        from: Lsn,
        follow: Follow,
    ) -> impl futures_util::Stream<Item = Result<RecordEvent, WalError>> {
        subscribe_acknowledged_records(
            self.wal.clone(),
            self.acknowledged.gate.clone(),
            from,
            follow,
        )
    }

    /// The end of the WAL acknowledged at the node's durability level: the local flush,
    /// except on a primary with synchronous standbys and a `synchronous_commit` other than
    /// `local`, where it is what the synchronous standbys confirmed at that level (never
    /// beyond the local flush). Readers see WAL up to here.
    pub fn acknowledged(&self) -> tokio::sync::watch::Receiver<Lsn> {
        self.acknowledged.end.clone()
    }

    /// The node's role and whether its walreceiver streams, as a watch that changes when
    /// either does: for following the node (the failover actor's member key, `/replica`)
    /// without asking it again and again.
    pub fn state(&self) -> tokio::sync::watch::Receiver<NodeState> {
        self.state.clone()
    }

    /// Tells the node its application has applied WAL up to `lsn`. On a standby the position
    /// travels upstream in status updates, so `remote_apply` appends there wait for it.
    ///
    /// Until the first report, a standby reports its flush position as apply (nothing there
    /// applies WAL); an application registers by reporting where it starts, before it reads.
    pub fn report_applied(&self, lsn: Lsn) {
        self.applied.send_if_modified(|a| {
            let advanced = lsn > *a;
            if advanced {
                *a = lsn;
            }
            advanced
        });
        self.supervisor.do_send(ReportApplied { lsn });
    }

    /// Waits until `lsn` is durable (or applied) on this node: read-your-writes for a client
    /// that got `lsn` from an append on the primary.
    pub async fn wait_for_lsn(&self, lsn: Lsn, level: LocalLevel) {
        match level {
            LocalLevel::Flushed => {
                let mut rx = actor_util::relayed(self.wal.subscribe());
                let _ = rx.wait_for(|p| p.flushed >= lsn).await;
            }
            LocalLevel::Applied => {
                let mut rx = self.applied.subscribe();
                let _ = rx.wait_for(|a| *a >= lsn).await;
            }
        }
    }
}
