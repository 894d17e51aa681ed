//! What every walsender of a node shares: the WAL, the settings (replaced whole on reload),
//! the TLS acceptor and the registry.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix::Addr;
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
        }
    }
}

/// Shared by the listener and every walsender of one node.
pub struct Shared {
    pub wal: Wal,
    settings: RwLock<Arc<WalSenderSettings>>,
    pub tls: Option<TlsAcceptor>,
    pub registry: Addr<WalSenderRegistry>,
}

impl Shared {
    pub fn new(
        wal: Wal,
        settings: WalSenderSettings,
        tls: Option<TlsAcceptor>,
        registry: Addr<WalSenderRegistry>,
    ) -> Arc<Shared> {
        Arc::new(Shared {
            wal,
            settings: RwLock::new(Arc::new(settings)),
            tls,
            registry,
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
