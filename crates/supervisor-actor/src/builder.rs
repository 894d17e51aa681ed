//! [`NodeBuilder`]: how any node, embedded or not, comes to life. The common cases are a few
//! lines (a primary in a directory, a standby of a conninfo), every knob is a typed setter
//! whose default is the configuration file's, and [`NodeBuilder::new`] takes a whole
//! [`NodeConfig`] for programs that build one themselves (`walserver run` does).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::net::TcpListener;
use wal_storage::{InitOptions, Lsn, Wal, WalFormat};
use walreceiver_actor::ReceiverConfig;
use walsender_actor::hba::HbaRules;
use walsender_actor::{Listener, Shared, WalSenderRegistry};

use crate::datadir::{create_private_dir, new_system_id, settle_role, DataDirState, StandbySignal};
use crate::durability::Durability;
use crate::error::NodeError;
use crate::fence::Fence;
use crate::node::{Node, NodeConfig};
use crate::restart::RestartPolicy;
use crate::supervisor::Supervisor;
use crate::visibility::Visibility;

/// Starts a node's actors in the current actix System.
///
/// A primary whose data directory is made on its first start and opened on later ones:
///
/// ```
/// use supervisor_actor::{Durability, NodeBuilder, ShutdownNode};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// actix_rt::System::new().block_on(async {
///     let node = NodeBuilder::primary(dir.path().join("data"))
///         .listen("127.0.0.1:0".parse()?)
///         .synchronous_standby_names("FIRST 1 (replica_a, replica_b)")?
///         .synchronous_commit(Durability::Local)
///         .start()
///         .await?;
///     println!("replication clients connect to {}", node.listen_addr);
///     node.supervisor.send(ShutdownNode { immediate: false }).await?;
///     Ok(())
/// })
/// # }
/// ```
///
/// A standby of a primary at a libpq conninfo: on its first start it asks the upstream who it
/// is and makes its data directory from the answer (system identifier, timeline history,
/// segment size), then streams from it:
///
/// ```no_run
/// use supervisor_actor::NodeBuilder;
///
/// # async fn standby() -> Result<(), supervisor_actor::NodeError> {
/// let node = NodeBuilder::standby("/var/lib/app/standby", "host=primary.example port=5433 user=repl")?
///     .listen("0.0.0.0:5433".parse().expect("an address"))
///     .primary_slot_name("app_standby")
///     .start()
///     .await?;
/// # Ok(())
/// # }
/// ```
pub struct NodeBuilder {
    config: NodeConfig,
    init: Init,
    /// A standby's `primary_conninfo` as given, for `standby.signal`.
    primary_conninfo: Option<String>,
}

/// What [`NodeBuilder::start`] does with a data directory that does not hold one yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Init {
    /// Nothing: the directory must hold one ([`NodeBuilder::new`]).
    Never,
    /// Make a primary's, with a new system identifier.
    Primary,
    /// Make a standby's from its upstream's identity.
    Standby,
}

impl NodeBuilder {
    /// A node from a whole configuration; its data directory must already exist (`walserver
    /// init`, or [`wal_storage::Wal::init`]).
    pub fn new(config: NodeConfig) -> NodeBuilder {
        NodeBuilder {
            config,
            init: Init::Never,
            primary_conninfo: None,
        }
    }

    /// A primary in `data_dir`. The first start makes the directory (mode 0700; it must be
    /// missing or empty) with a new system identifier, timeline 1 and walserver records;
    /// later starts open it. A standby's directory (see `datadir`'s role rule) is refused.
    pub fn primary(data_dir: impl Into<PathBuf>) -> NodeBuilder {
        NodeBuilder {
            config: NodeConfig::new(data_dir, crate::node::DEFAULT_LISTEN),
            init: Init::Primary,
            primary_conninfo: None,
        }
    }

    /// A standby of the upstream `primary_conninfo` names (a libpq connection string, as
    /// PostgreSQL's `primary_conninfo`), in `data_dir`. The first start connects to the
    /// upstream, adopts its identity, makes the directory from it and writes
    /// `standby.signal`; later starts open it and stream from the upstream given here. Once
    /// the node has been promoted (which the control data records) it starts as a primary.
    pub fn standby(
        data_dir: impl Into<PathBuf>,
        primary_conninfo: &str,
    ) -> Result<NodeBuilder, NodeError> {
        let mut config = NodeConfig::new(data_dir, crate::node::DEFAULT_LISTEN);
        config.standby = Some(ReceiverConfig::parse(primary_conninfo, None)?);
        config.standby_signal = Some(StandbySignal::path(&config.data_dir));
        Ok(NodeBuilder {
            config,
            init: Init::Standby,
            primary_conninfo: Some(primary_conninfo.to_string()),
        })
    }

    /// The configuration so far, to read or to change what no setter reaches.
    pub fn config_mut(&mut self) -> &mut NodeConfig {
        &mut self.config
    }

    /// Where the replication protocol listens (`listen`; default 127.0.0.1:5433, port 0
    /// picks a free one).
    pub fn listen(mut self, addr: SocketAddr) -> NodeBuilder {
        self.config.listen = addr;
        self
    }

    /// The segment size of a data directory made on the first start (default 16 MiB); an
    /// existing directory keeps its own, and a standby's is its upstream's.
    pub fn segment_size(mut self, bytes: u64) -> NodeBuilder {
        self.config.storage.segment_size = bytes;
        self
    }

    /// `max_wal_senders` (default 10).
    pub fn max_wal_senders(mut self, n: usize) -> NodeBuilder {
        self.config.max_wal_senders = n;
        self
    }

    /// `authentication_timeout` (default 60 s).
    pub fn authentication_timeout(mut self, timeout: Duration) -> NodeBuilder {
        self.config.walsender.authentication_timeout = timeout;
        self
    }

    /// `wal_sender_timeout` (default 60 s; zero disables).
    pub fn wal_sender_timeout(mut self, timeout: Duration) -> NodeBuilder {
        Arc::make_mut(&mut self.config.walsender.session).wal_sender_timeout = timeout;
        self
    }

    /// `wal_sender_shutdown_timeout`: how long a fast shutdown waits for standbys to confirm
    /// what they were sent (default 10 s).
    pub fn wal_sender_shutdown_timeout(mut self, timeout: Duration) -> NodeBuilder {
        self.config.wal_sender_shutdown_timeout = timeout;
        self
    }

    /// `wal_keep_size` in bytes (default 0).
    pub fn wal_keep_size(mut self, bytes: u64) -> NodeBuilder {
        self.config.storage.wal_keep_size = bytes;
        self
    }

    /// `max_slot_wal_keep_size` in bytes; `None` (the default, PostgreSQL's -1) is unlimited.
    pub fn max_slot_wal_keep_size(mut self, bytes: Option<u64>) -> NodeBuilder {
        self.config.storage.max_slot_wal_keep_size = bytes;
        self
    }

    /// `max_wal_size` in bytes: past it a slot's `wal_status` turns from reserved to extended
    /// (default 1 GiB).
    pub fn max_wal_size(mut self, bytes: u64) -> NodeBuilder {
        self.config.storage.max_wal_size = bytes;
        self
    }

    /// `wal_recycle`: whether a segment file nobody needs any more becomes a later segment
    /// instead of being removed (default on; off suits copy-on-write file systems).
    pub fn wal_recycle(mut self, on: bool) -> NodeBuilder {
        self.config.storage.wal_recycle = on;
        self
    }

    /// `synchronous_standby_names` in PostgreSQL's grammar (`a`, `FIRST 2 (a, b, c)`,
    /// `ANY 1 (*)`); empty (the default) makes no standby synchronous.
    pub fn synchronous_standby_names(mut self, names: &str) -> Result<NodeBuilder, NodeError> {
        self.config.sync.standby_names = walsender_actor::syncrep::parse_sync_standby_names(names)
            .map_err(|reason| NodeError::InvalidSetting {
                name: "synchronous_standby_names",
                reason,
            })?;
        Ok(self)
    }

    /// `synchronous_commit`: the durability of an append that names none (default `on`).
    pub fn synchronous_commit(mut self, durability: Durability) -> NodeBuilder {
        self.config.sync.default_durability = durability;
        self
    }

    /// `synchronous_wait_timeout`: after this long an append still waiting for synchronous
    /// standbys fails; `None` (the default, the file's 0) waits as long as it takes.
    pub fn synchronous_wait_timeout(mut self, timeout: Option<Duration>) -> NodeBuilder {
        self.config.sync.wait_timeout = timeout;
        self
    }

    /// `primary_slot_name`: a standby streams through this physical slot upstream (default
    /// none). No effect on a primary.
    pub fn primary_slot_name(mut self, slot: impl Into<String>) -> NodeBuilder {
        if let Some(r) = &mut self.config.standby {
            r.session.slot_name = Some(slot.into()).filter(|s| !s.is_empty());
        }
        self
    }

    /// `wal_receiver_timeout` (default 60 s; zero disables). No effect on a primary.
    pub fn wal_receiver_timeout(mut self, timeout: Duration) -> NodeBuilder {
        if let Some(r) = &mut self.config.standby {
            r.session.wal_receiver_timeout = timeout;
        }
        self
    }

    /// `wal_receiver_status_interval` (default 10 s). No effect on a primary.
    pub fn wal_receiver_status_interval(mut self, interval: Duration) -> NodeBuilder {
        if let Some(r) = &mut self.config.standby {
            r.session.wal_receiver_status_interval = interval;
        }
        self
    }

    /// `cluster_name`: a standby's application_name upstream when its conninfo names none
    /// (default `walreceiver`). No effect on a primary.
    pub fn cluster_name(mut self, name: &str) -> NodeBuilder {
        if let Some(r) = &mut self.config.standby {
            r.application_name =
                ReceiverConfig::new(r.conninfo.clone(), Some(name)).application_name;
        }
        self
    }

    /// TLS for the replication port (the file's `ssl_cert_file` and `ssl_key_file`; default
    /// none). `protocol_codec::tls::server_config` loads one from PEM files.
    pub fn tls(mut self, config: Arc<tokio_rustls::rustls::ServerConfig>) -> NodeBuilder {
        self.config.tls = Some(config);
        Arc::make_mut(&mut self.config.walsender.auth).tls_available = true;
        self
    }

    /// Offers SCRAM-SHA-256-PLUS on TLS connections, bound to `end_point`: the
    /// tls-server-end-point data of the certificate given to [`NodeBuilder::tls`]
    /// (`protocol_codec::tls::server_end_point` reads it from the same PEM file). Default:
    /// SCRAM-SHA-256 only. Data of another certificate makes every -PLUS exchange fail.
    pub fn tls_channel_binding(mut self, end_point: Vec<u8>) -> NodeBuilder {
        self.config.tls_channel_binding = Some(end_point);
        self
    }

    /// The access rules (the file's `[[hba]]`; default: loopback trusted, all else refused).
    pub fn hba(mut self, rules: HbaRules) -> NodeBuilder {
        Arc::make_mut(&mut self.config.walsender.auth).hba = rules;
        self
    }

    /// Users and their password verifiers (the file's `[users]`: `SCRAM-SHA-256$...` or
    /// `md5...`; default none).
    pub fn users(mut self, users: BTreeMap<String, String>) -> NodeBuilder {
        Arc::make_mut(&mut self.config.walsender.auth).users = users;
        self
    }

    /// Threads that host walsenders and the walreceiver (default one per core; 0 keeps them
    /// on the caller's arbiter).
    pub fn io_threads(mut self, n: usize) -> NodeBuilder {
        self.config.io_threads = n;
        self
    }

    /// The fence the node asks before acknowledging an append (default [`Fence::open`]: it
    /// always acknowledges, as without automatic failover). A failover actor keeps a clone
    /// of a [`Fence::closed`] one and grants it while it holds the cluster's leadership.
    pub fn fence(mut self, fence: Fence) -> NodeBuilder {
        self.config.fence = fence;
        self
    }

    /// How the walreceiver is restarted after it stops (default [`RestartPolicy::default`]).
    pub fn restart_policy(mut self, policy: RestartPolicy) -> NodeBuilder {
        self.config.restart_policy = policy;
        self
    }

    /// Makes the data directory on the first start (see [`NodeBuilder::primary`] and
    /// [`NodeBuilder::standby`]), opens it and starts the node's actors in the current actix
    /// System.
    pub async fn start(self) -> Result<Node, NodeError> {
        let NodeBuilder {
            mut config,
            init,
            primary_conninfo,
        } = self;
        prepare(&mut config, init, primary_conninfo).await?;
        start_actors(config).await
    }
}

/// Runs blocking work (directory checks, init's fsyncs) off the actor thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, NodeError> + Send + 'static,
) -> Result<T, NodeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| NodeError::OpenPanicked)?
}

/// Makes the data directory on a first start, and decides on later ones whether a standby
/// still is one.
async fn prepare(
    config: &mut NodeConfig,
    init: Init,
    primary_conninfo: Option<String>,
) -> Result<(), NodeError> {
    if init == Init::Never {
        return Ok(());
    }
    let dir = config.data_dir.clone();
    let state = {
        let dir = dir.clone();
        blocking(move || {
            let state = DataDirState::of(&dir)?;
            Ok((state, StandbySignal::if_standby(&dir)?.is_some()))
        })
        .await?
    };
    match (init, state) {
        (Init::Primary, (DataDirState::New, _)) => {
            let storage = config.storage.clone();
            let system_id = blocking(move || {
                create_private_dir(&dir)?;
                let system_id = new_system_id();
                drop(Wal::init(
                    &dir,
                    storage,
                    InitOptions::primary(system_id, WalFormat::Walserver),
                )?);
                Ok(system_id)
            })
            .await?;
            tracing::info!(%system_id, "initialised a primary's data directory");
        }
        (Init::Primary, (DataDirState::Initialised, true)) => {
            return Err(NodeError::StandbyDirectory { dir });
        }
        (Init::Standby, (DataDirState::New, _)) => {
            let receiver = config
                .standby
                .as_ref()
                .expect("NodeBuilder::standby sets it");
            let identity = walreceiver_actor::fetch_upstream_identity(
                &receiver.conninfo,
                receiver.session.slot_name.as_deref(),
                &receiver.application_name,
            )
            .await?;
            let signal = StandbySignal {
                primary_conninfo,
                primary_slot_name: receiver.session.slot_name.clone(),
                standby_since: None,
            };
            let storage = config.storage.clone();
            blocking(move || {
                create_private_dir(&dir)?;
                drop(walreceiver_actor::init_standby(&dir, storage, &identity)?);
                signal.write(&dir)?;
                Ok(())
            })
            .await?;
            tracing::info!("initialised a standby's data directory from its upstream");
        }
        (Init::Standby, (DataDirState::Initialised, false)) => {
            tracing::info!(
                "the control data says primary: the node was promoted and starts as a primary"
            );
            config.standby = None;
        }
        (_, (DataDirState::Initialised, _)) => {}
        (Init::Never, _) => unreachable!("returned above"),
    }
    Ok(())
}

/// Opens the data directory `config` names and starts the node's actors in the current actix
/// System.
async fn start_actors(config: NodeConfig) -> Result<Node, NodeError> {
    let NodeConfig {
        data_dir,
        mut storage,
        listen,
        max_wal_senders,
        mut walsender,
        wal_sender_shutdown_timeout,
        tls,
        tls_channel_binding,
        io_threads,
        standby,
        restart_policy,
        standby_signal,
        sync,
        fence,
    } = config;
    // Recovery reads and fsyncs: keep it off the actor thread. Then the control data and
    // standby.signal are made to agree with the role the node starts in.
    let signals = standby_signal.is_some();
    let dir = data_dir.clone();
    let is_standby = standby.is_some();
    // Rule 5 of the overlapped commit (`walsender_actor::overlap::starts_new_timeline`): a
    // primary does not resume a timeline on which it may have sent a synchronous standby WAL
    // it then lost. Under failover the new timeline comes with the term the failover actor
    // takes up, so the node here only opens.
    let primary_here = !is_standby && !fence.is_managed();
    let wal = tokio::task::spawn_blocking(move || {
        storage.segment_size = Wal::stored_segment_size(&data_dir)?;
        let wal = Wal::open(&data_dir, storage)?;
        if signals {
            settle_role(&data_dir, &wal, is_standby)?;
        }
        // Taken at every start, before anything is appended, so that a crash after this
        // start is never taken for a clean shutdown. After a clean one no standby holds a
        // byte this node lacks: it removes the early-send mark, and the timeline goes on
        // (`Supervisor`'s `ShutdownDone`).
        let clean = wal.take_clean_shutdown_mark()?;
        let marked = wal.early_sends_marked();
        // Before the listener and the supervisor exist, so nothing is appended or streamed
        // on the old timeline past what recovery found. Relayed PostgreSQL WAL takes no
        // appends here, so it has no timeline to protect.
        if primary_here
            && wal.format() == WalFormat::Walserver
            && walsender_actor::overlap::starts_new_timeline(marked, wal.timeline())
        {
            let (timeline, switch_lsn) = wal.promote("restarted after early sends")?;
            tracing::info!(%timeline, switch = %switch_lsn, "a new timeline before the first append: a synchronous standby may hold WAL of the old one that this node lost");
        } else if primary_here && clean {
            tracing::info!(timeline = %wal.timeline(), "the last shutdown was clean: the timeline goes on");
        }
        Ok::<_, NodeError>(wal)
    })
    .await
    .map_err(|_| NodeError::OpenPanicked)??;
    // The overlapped commit needs each batch's written end announced before its sync; the
    // walsenders decide who may be sent it.
    wal.set_publish_written(walsender.session.commit_overlap);
    if walsender.session.commit_overlap && (is_standby || fence.is_managed()) {
        // A standby under the overlapped commit knows no commit point until its upstream
        // tells it one, beyond the one it stored before (`DATA/commit_point`), so its readers
        // wait for that rather than read a tail that may be cut back. A primary under
        // failover is in the same place until it takes up a term (`PromoteForTerm`, which
        // forgets the told point) or follows a leader that tells it one: its tail past the commit
        // point it knew before the restart may be past the next leader's fork, and is cut
        // when it follows.
        wal.set_told_commit_point(Some(wal_storage::Lsn::INVALID));
    }
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
    // A primary under failover starts with its fence closed, so it is read-only to clients
    // from its first connection (the supervisor keeps this true from then on).
    walsender.read_only = crate::supervisor::read_only_to_clients(standby.is_none(), &fence);
    // Every node answers the SHOWs its storage decides, whatever else was configured.
    let base = walsender_actor::session::base_show_values(wal.segment_size(), wal.format());
    let mut session = (*walsender.session).clone();
    session.show = Arc::new(walsender_actor::session::merge_show_values(
        base,
        &session.show,
    ));
    walsender.session = Arc::new(session);
    let registry = WalSenderRegistry::new(max_wal_senders, wal.clone());
    let (visibility, acknowledged) = Visibility::new(
        &wal,
        crate::visibility::rule_of(standby.is_none(), &sync),
        registry.sync_positions(),
        walsender.session.commit_overlap,
    );
    let registry = registry.start();
    let shared = Shared::new(
        wal.clone(),
        walsender,
        tls.map(|config| walsender_actor::ServerTls {
            acceptor: tokio_rustls::TlsAcceptor::from(config),
            channel_binding: tls_channel_binding,
        }),
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
        fence.clone(),
        dir,
        visibility,
    );
    let append_metrics = supervisor.append_metrics.clone();
    let state = supervisor.state.subscribe();
    let supervisor = supervisor.start();
    Ok(Node {
        supervisor,
        registry,
        shared,
        wal,
        listen_addr,
        append_metrics,
        fence,
        acknowledged,
        applied: Arc::new(tokio::sync::watch::channel(Lsn::INVALID).0),
        state,
    })
}
