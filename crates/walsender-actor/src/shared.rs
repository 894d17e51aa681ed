//! What every walsender of a node shares: the WAL, the settings (replaced whole on reload),
//! the TLS acceptor, the registry and the counters of the startup phase.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix::Addr;
use protocol_codec::client_settings::TcpKeepalives;
use tokio_rustls::TlsAcceptor;
use wal_storage::Wal;

use crate::registry::WalSenderRegistry;
use crate::session::SessionConfig;
use crate::startup::AuthSettings;

/// The settings of a node's walsenders that a reload may change.
#[derive(Clone, Debug)]
pub struct WalSenderSettings {
    pub auth: Arc<AuthSettings>,
    pub session: Arc<SessionConfig>,
    /// How long a client may take from connecting to finishing authentication.
    pub authentication_timeout: Duration,
    /// How long the writer may take to deliver the last bytes of a closing connection to a
    /// client that does not read; after it the socket is dropped.
    pub close_grace: Duration,
    /// `server_version` in the greeting; must read as 15.x for PostgreSQL 15's tools.
    pub server_version: String,
    /// Whether the node is a standby (`in_hot_standby` in the greeting).
    pub in_hot_standby: bool,
    /// Whether the node is a primary that acknowledges no writes now, because the failover
    /// fence that lets it acknowledge is closed (not yet, or no longer, the cluster's leader).
    /// The greeting then says `default_transaction_read_only = on`, so that a client asking for
    /// a writable server (libpq's `target_session_attrs=read-write`) passes it by, as it
    /// passes a standby by.
    pub read_only: bool,
    /// The TCP keepalive timing of accepted connections (PostgreSQL's `tcp_keepalives_*` and
    /// `tcp_user_timeout`); unset keeps the system's. A client may set its own.
    pub tcp_keepalives: TcpKeepalives,
}

impl Default for WalSenderSettings {
    fn default() -> Self {
        WalSenderSettings {
            auth: Arc::new(AuthSettings::default()),
            session: Arc::new(SessionConfig::default()),
            authentication_timeout: Duration::from_secs(60),
            close_grace: Duration::from_secs(10),
            server_version: crate::SERVER_VERSION.to_string(),
            in_hot_standby: false,
            read_only: false,
            tcp_keepalives: TcpKeepalives::default(),
        }
    }
}

/// TLS on the replication port: the acceptor, and the tls-server-end-point data of the
/// certificate it presents (`protocol_codec::tls::server_end_point`), with which
/// SCRAM-SHA-256-PLUS is offered on TLS connections. Without that data only SCRAM-SHA-256 is.
#[derive(Clone)]
pub struct ServerTls {
    pub acceptor: TlsAcceptor,
    pub channel_binding: Option<Vec<u8>>,
}

/// Shared by the listener and every walsender of one node.
pub struct Shared {
    pub wal: Wal,
    settings: RwLock<Arc<WalSenderSettings>>,
    pub tls: Option<ServerTls>,
    pub registry: Addr<WalSenderRegistry>,
    pub metrics: StartupMetrics,
}

/// What `/metrics` shows of connections before they reach the registry: those still in the
/// startup phase, and the ones refused for their credentials or the hba rules. (The registry
/// knows every connection after it; a refused one never gets there.)
#[derive(Debug, Default)]
pub struct StartupMetrics {
    authenticating: AtomicU64,
    authentication_failures: AtomicU64,
}

impl StartupMetrics {
    /// Connections in the startup phase now (TLS, startup packet, authentication).
    pub fn authenticating(&self) -> u64 {
        self.authenticating.load(Ordering::Relaxed)
    }

    /// Connections refused with an authentication error (SQLSTATE class 28: a wrong password,
    /// an unknown role, a rule that rejects) since the node started.
    pub fn authentication_failures(&self) -> u64 {
        self.authentication_failures.load(Ordering::Relaxed)
    }

    pub(crate) fn authentication_failed(&self) {
        self.authentication_failures.fetch_add(1, Ordering::Relaxed);
    }
}

/// One connection in the startup phase, counted from its accept; dropping it, however the
/// phase ends (or if the walsender never starts), uncounts it.
pub struct Authenticating(Arc<Shared>);

impl Authenticating {
    /// Counts a connection of `shared`'s node as in the startup phase.
    pub(crate) fn start(shared: &Arc<Shared>) -> Authenticating {
        shared
            .metrics
            .authenticating
            .fetch_add(1, Ordering::Relaxed);
        Authenticating(shared.clone())
    }
}

impl Drop for Authenticating {
    fn drop(&mut self) {
        self.0
            .metrics
            .authenticating
            .fetch_sub(1, Ordering::Relaxed);
    }
}

impl Shared {
    pub fn new(
        wal: Wal,
        settings: WalSenderSettings,
        tls: Option<ServerTls>,
        registry: Addr<WalSenderRegistry>,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            wal,
            settings: RwLock::new(Arc::new(settings)),
            tls,
            registry,
            metrics: StartupMetrics::default(),
        })
    }

    pub fn settings(&self) -> Arc<WalSenderSettings> {
        self.settings
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the settings; running walsenders pick them up on [`crate::messages::SettingsChanged`].
    pub fn replace_settings(&self, s: WalSenderSettings) {
        *self.settings.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(s);
    }
}
