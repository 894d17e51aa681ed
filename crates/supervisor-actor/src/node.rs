//! Starting a node and the supervisor actor that owns it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use serde::Serialize;
use tokio::net::TcpListener;
use wal_storage::{Lsn, StorageConfig, SystemId, TimelineId, Wal, WalError, WalFormat};
use walsender_actor::messages::{GetReplicationStatus, ShutdownWalSenders, StopAccepting};
use walsender_actor::session::ShutdownMode;
use walsender_actor::status::WalSenderStatus;
use walsender_actor::{Listener, Shared, WalSenderRegistry, WalSenderSettings};

use crate::append::{AppendError, AppendRecords, Appended, Durability};

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
    /// Threads that host walsenders; 0 keeps them on the caller's arbiter.
    pub io_threads: usize,
}

impl NodeConfig {
    pub fn new(data_dir: impl Into<PathBuf>, listen: SocketAddr) -> NodeConfig {
        NodeConfig {
            data_dir: data_dir.into(),
            storage: StorageConfig::default(),
            listen,
            max_wal_senders: 10,
            walsender: WalSenderSettings::default(),
            wal_sender_shutdown_timeout: Duration::from_secs(10),
            tls: None,
            io_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Storage(#[from] WalError),
    #[error("cannot listen on {addr}: {source}")]
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
        if tls.is_none() {
            walsender.auth = Arc::new(walsender_actor::startup::AuthSettings {
                tls_available: false,
                ..clone_auth(&walsender.auth)
            });
        }
        let registry = WalSenderRegistry::new(max_wal_senders).start();
        let shared = Shared::new(
            wal.clone(),
            walsender,
            tls.map(tokio_rustls::TlsAcceptor::from),
            registry.clone(),
        );
        let arbiters: Vec<Arbiter> = (0..io_threads).map(|_| Arbiter::new()).collect();
        let handles = arbiters.iter().map(Arbiter::handle).collect();
        let listener = Listener::start(listener, shared.clone(), handles).map_err(|source| {
            NodeError::Listen {
                addr: listen,
                source,
            }
        })?;
        tracing::info!(%listen_addr, "accepting replication connections");
        let supervisor = Supervisor {
            wal: Some(wal.clone()),
            registry: registry.clone(),
            listener: Some(listener),
            arbiters,
            shutdown_timeout: wal_sender_shutdown_timeout,
            shutting_down: false,
            shutdown_waiters: Vec::new(),
        }
        .start();
        Ok(Node {
            supervisor,
            registry,
            shared,
            wal,
            listen_addr,
        })
    }
}

fn clone_auth(
    a: &walsender_actor::startup::AuthSettings,
) -> walsender_actor::startup::AuthSettings {
    walsender_actor::startup::AuthSettings {
        hba: a.hba.clone(),
        users: a.users.clone(),
        tls_available: a.tls_available,
    }
}

/// Whether the node serves as a primary or follows an upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeRole {
    Primary,
    Standby,
}

/// What `/status` shows.
#[derive(Clone, Debug, Serialize)]
pub struct NodeStatus {
    pub role: NodeRole,
    pub system_identifier: SystemId,
    pub timeline: TimelineId,
    pub flush_lsn: Lsn,
    pub wal_format: WalFormat,
    pub replication: Vec<WalSenderStatus>,
}

/// Owns the node's children and shuts them down in order.
pub struct Supervisor {
    wal: Option<Wal>,
    registry: Addr<WalSenderRegistry>,
    listener: Option<Addr<Listener>>,
    arbiters: Vec<Arbiter>,
    shutdown_timeout: Duration,
    shutting_down: bool,
    shutdown_waiters: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Appends from many clients arrive here: a deeper mailbox keeps `send` from parking.
        ctx.set_mailbox_capacity(4096);
    }
}

impl Handler<AppendRecords> for Supervisor {
    type Result = ResponseFuture<Result<Appended, AppendError>>;

    fn handle(&mut self, msg: AppendRecords, _: &mut Context<Self>) -> Self::Result {
        let wal = self.wal.clone();
        let shutting_down = self.shutting_down;
        Box::pin(async move {
            let wal = match wal {
                Some(w) if !shutting_down => w,
                _ => return Err(AppendError::ShuttingDown),
            };
            if wal.format() != WalFormat::Walserver {
                return Err(AppendError::RelayedPostgresWal);
            }
            if msg.records.is_empty() {
                return Err(AppendError::Empty);
            }
            let durability = msg.durability.unwrap_or(Durability::Local);
            let record_ends = wal.append(msg.records)?.await?;
            let end_lsn = *record_ends
                .last()
                .expect("one end per record, and there are records");
            Ok(Appended {
                end_lsn,
                record_ends,
                timeline: wal.timeline(),
                durability,
            })
        })
    }
}

/// Shut the node down: stop accepting, end the walsenders as `mode` says (a fast shutdown
/// waits up to `wal_sender_shutdown_timeout` for standbys to confirm), then release storage.
/// Answered when done; a second request while one runs may turn a fast shutdown immediate.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ShutdownNode {
    pub immediate: bool,
}

/// The node's status, as `/status` shows it.
#[derive(Message)]
#[rtype(result = "Result<NodeStatus, MailboxError>")]
pub struct GetNodeStatus;

#[derive(Message)]
#[rtype(result = "()")]
struct ShutdownDone;

impl Handler<ShutdownNode> for Supervisor {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, msg: ShutdownNode, ctx: &mut Context<Self>) -> Self::Result {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.shutdown_waiters.push(tx);
        let mode = if msg.immediate {
            ShutdownMode::Immediate
        } else {
            ShutdownMode::Fast {
                deadline: Instant::now() + self.shutdown_timeout,
            }
        };
        if self.shutting_down && !msg.immediate {
            return Box::pin(async move {
                let _ = rx.await;
            });
        }
        tracing::info!(?mode, "shutting down");
        if let Some(l) = self.listener.take() {
            l.do_send(StopAccepting);
        }
        // A second, immediate request reaches the walsenders still draining.
        let registry = self.registry.clone();
        let first = !self.shutting_down;
        self.shutting_down = true;
        let me = ctx.address();
        actix_rt::spawn(async move {
            let _ = registry.send(ShutdownWalSenders { mode }).await;
            if first {
                me.do_send(ShutdownDone);
            }
        });
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

impl Handler<ShutdownDone> for Supervisor {
    type Result = ();

    fn handle(&mut self, _: ShutdownDone, ctx: &mut Context<Self>) {
        // Storage last: dropping the supervisor's handle lets the writer thread finish once
        // the other holders are gone; every acknowledged write is already durable.
        self.wal = None;
        for a in self.arbiters.drain(..) {
            a.stop();
        }
        for w in self.shutdown_waiters.drain(..) {
            let _ = w.send(());
        }
        tracing::info!("shutdown complete");
        ctx.stop();
    }
}

impl Handler<GetNodeStatus> for Supervisor {
    type Result = ResponseFuture<Result<NodeStatus, MailboxError>>;

    fn handle(&mut self, _: GetNodeStatus, _: &mut Context<Self>) -> Self::Result {
        let registry = self.registry.clone();
        let wal = self.wal.clone();
        Box::pin(async move {
            let replication = registry.send(GetReplicationStatus).await?;
            let wal = wal.ok_or(MailboxError::Closed)?;
            let pos = wal.position();
            Ok(NodeStatus {
                role: NodeRole::Primary,
                system_identifier: wal.system_id(),
                timeline: pos.timeline,
                flush_lsn: pos.flushed,
                wal_format: wal.format(),
                replication,
            })
        })
    }
}
