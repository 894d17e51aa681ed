//! Starting a node: the configuration and the builder that hands back the actors' addresses.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::net::TcpListener;
use wal_storage::{Lsn, StorageConfig, Wal, WalError};
use walreceiver_actor::ReceiverConfig;
use walsender_actor::{Listener, Shared, WalSenderRegistry, WalSenderSettings};

use crate::append::SyncSettings;
use crate::records::{subscribe_records, Follow, RecordEvent};
use crate::restart::RestartPolicy;
use crate::supervisor::ReportApplied;
use crate::supervisor::Supervisor;

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
    /// Threads that host walsenders and the walreceiver; 0 keeps them on the caller's arbiter.
    pub io_threads: usize,
    /// `Some` makes the node a standby that streams from this upstream.
    pub standby: Option<ReceiverConfig>,
    pub restart_policy: RestartPolicy,
    /// A file whose presence marks a standby (PostgreSQL's `standby.signal`); promotion
    /// removes it so a restart does not make the node a standby again.
    pub standby_signal: Option<PathBuf>,
    /// Synchronous replication and the default durability of appends.
    pub sync: SyncSettings,
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
            io_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            standby: None,
            restart_policy: RestartPolicy::default(),
            standby_signal: None,
            sync: SyncSettings::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Storage(#[from] WalError),
    // The source's text is not repeated here: whoever prints the whole chain prints it once.
    #[error("cannot listen on {addr} (listen)")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the storage thread panicked while opening the data directory")]
    OpenPanicked,
}

/// Starts a node's actors.
pub struct NodeBuilder {
    config: NodeConfig,
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
    /// What this node's application has applied (see [`Node::report_applied`]).
    applied: Arc<tokio::sync::watch::Sender<Lsn>>,
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
    /// LSN order, across timeline switches, as they become durable.
    pub fn records(
        &self,
        from: Lsn,
        follow: Follow,
    ) -> impl futures_util::Stream<Item = Result<RecordEvent, WalError>> {
        subscribe_records(self.wal.clone(), from, follow)
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
                let mut rx = self.wal.subscribe();
                let _ = rx.wait_for(|p| p.flushed >= lsn).await;
            }
            LocalLevel::Applied => {
                let mut rx = self.applied.subscribe();
                let _ = rx.wait_for(|a| *a >= lsn).await;
            }
        }
    }
}

impl NodeBuilder {
    pub fn new(config: NodeConfig) -> NodeBuilder {
        NodeBuilder { config }
    }

    /// Opens the data directory and starts the node's actors in the current actix System.
    pub async fn start(self) -> Result<Node, NodeError> {
        let NodeConfig {
            data_dir,
            mut storage,
            listen,
            max_wal_senders,
            mut walsender,
            wal_sender_shutdown_timeout,
            tls,
            io_threads,
            standby,
            restart_policy,
            standby_signal,
            sync,
        } = self.config;
        // Recovery reads and fsyncs: keep it off the actor thread.
        let wal = tokio::task::spawn_blocking(move || {
            storage.segment_size = Wal::stored_segment_size(&data_dir)?;
            Wal::open(&data_dir, storage)
        })
        .await
        .map_err(|_| NodeError::OpenPanicked)??;
        let report = wal.recovery_report();
        tracing::info!(
            timeline = %report.timeline,
            end = %report.end,
            discarded_bytes = report.discarded_bytes,
            "data directory opened"
        );
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| NodeError::Listen {
                addr: listen,
                source,
            })?;
        let listen_addr = listener.local_addr().map_err(|source| NodeError::Listen {
            addr: listen,
            source,
        })?;
        if tls.is_none() && walsender.auth.tls_available {
            let mut auth = (*walsender.auth).clone();
            auth.tls_available = false;
            walsender.auth = Arc::new(auth);
        }
        walsender.in_hot_standby = standby.is_some();
        // Every node answers the SHOWs its storage decides, whatever else was configured.
        let base = walsender_actor::session::base_show_values(wal.segment_size(), wal.format());
        let mut session = (*walsender.session).clone();
        session.show = Arc::new(walsender_actor::session::merge_show_values(
            base,
            &session.show,
        ));
        walsender.session = Arc::new(session);
        let registry = WalSenderRegistry::new(max_wal_senders).start();
        let shared = Shared::new(
            wal.clone(),
            walsender,
            tls.map(tokio_rustls::TlsAcceptor::from),
            registry.clone(),
        );
        let arbiters: Vec<Arbiter> = (0..io_threads).map(|_| Arbiter::new()).collect();
        let handles: Vec<ArbiterHandle> = arbiters.iter().map(Arbiter::handle).collect();
        let listener =
            Listener::start(listener, shared.clone(), handles.clone()).map_err(|source| {
                NodeError::Listen {
                    addr: listen,
                    source,
                }
            })?;
        tracing::info!(%listen_addr, standby = standby.is_some(), "accepting replication connections");
        let supervisor = Supervisor::new(
            wal.clone(),
            shared.clone(),
            registry.clone(),
            listener,
            arbiters,
            wal_sender_shutdown_timeout,
            standby,
            restart_policy,
            standby_signal,
            sync,
        )
        .start();
        Ok(Node {
            supervisor,
            registry,
            shared,
            wal,
            listen_addr,
            applied: Arc::new(tokio::sync::watch::channel(Lsn::INVALID).0),
        })
    }
}
