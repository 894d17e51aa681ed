//! What the integration tests share: a walserver primary running in its own actix System on
//! its own thread (so it can be killed as a process would be), standby storage, an owner
//! actor that turns the walreceiver's events into a channel, and waits with deadlines.
//! `tests/pg_interop.rs` and `benches/receive.rs` use it too, and not all of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use bytes::Bytes;
use protocol_codec::conninfo::ConnInfo;
use tokio::sync::mpsc;
use wal_storage::{InitOptions, Lsn, StorageConfig, SystemId, TimelineId, Wal, WalFormat};
use walreceiver_actor::messages::*;
use walreceiver_actor::{ReceiverConfig, WalReceiver};
use walsender_actor::hba::{AuthMethod, HbaRuleSettings, HbaRules};
use walsender_actor::messages::{GetListenAddr, GetReplicationStatus, ShutdownWalSenders};
use walsender_actor::session::{SessionConfig, ShutdownMode};
use walsender_actor::startup::AuthSettings;
use walsender_actor::status::WalSenderStatus;
use walsender_actor::{Listener, Shared, WalSenderRegistry, WalSenderSettings};

/// Small segments, so that tests cross segment boundaries and preallocate little.
pub const SEGMENT: u64 = 1 << 20;
pub const SYSTEM: SystemId = SystemId(7_000_000_000_000_000_042);
/// Long enough never to fire in a test that does not mean it to.
pub const DEADLINE: Duration = Duration::from_secs(30);

pub fn storage_config() -> StorageConfig {
    StorageConfig {
        segment_size: SEGMENT,
        fsync: false,
        ..StorageConfig::default()
    }
}

/// A new primary's data directory. It keeps its WAL (`wal_keep_size`), so standbys that start
/// at its beginning find it.
pub fn primary_wal(dir: &Path) -> Wal {
    Wal::init(
        dir,
        keeping_config(),
        InitOptions::primary(SYSTEM, WalFormat::Walserver),
    )
    .expect("init primary")
}

/// A standby's data directory: the primary's system identifier (or `system_id`), timeline 1,
/// starting at segment 1 like the primary.
pub fn standby_wal(dir: &Path, system_id: SystemId) -> Wal {
    Wal::init(
        dir,
        keeping_config(),
        InitOptions::primary(system_id, WalFormat::Walserver),
    )
    .expect("init standby")
}

/// Storage that keeps its WAL (`wal_keep_size`), so it can be compared whole.
pub fn keeping_config() -> StorageConfig {
    StorageConfig {
        wal_keep_size: 1 << 30,
        ..storage_config()
    }
}

/// How the test primary lets clients in.
pub enum Access {
    /// Loopback trusted (the built-in default).
    Trust,
    /// SCRAM-SHA-256 for `user` with `password`.
    Scram {
        user: &'static str,
        password: &'static str,
    },
}

/// A walserver primary: a listener and walsenders over `wal`, in an actix System of its own.
pub struct Primary {
    pub wal: Wal,
    pub addr: SocketAddr,
    pub registry: Addr<WalSenderRegistry>,
    system: System,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Primary {
    pub fn start(wal: Wal, access: Access) -> Primary {
        Primary::start_tls(wal, access, None)
    }

    /// A primary that offers TLS with this certificate chain and key (PEM files).
    pub fn start_tls(wal: Wal, access: Access, tls: Option<(&Path, &Path)>) -> Primary {
        let mut auth = AuthSettings::default();
        let acceptor = tls.map(|(cert, key)| {
            let config = protocol_codec::tls::server_config(cert, key).expect("TLS configuration");
            walsender_actor::ServerTls {
                acceptor: tokio_rustls::TlsAcceptor::from(config),
                channel_binding: protocol_codec::tls::server_end_point(cert)
                    .expect("the certificate"),
            }
        });
        auth.tls_available = acceptor.is_some();
        if let Access::Scram { user, password } = access {
            auth.hba = HbaRules::from_settings(&[HbaRuleSettings {
                conn_type: Default::default(),
                address: "127.0.0.1/32".into(),
                user: "all".into(),
                method: AuthMethod::ScramSha256,
            }])
            .expect("hba rules");
            auth.users = BTreeMap::from([(
                user.to_string(),
                protocol_codec::auth::make_scram_verifier(password),
            )]);
        }
        let settings = WalSenderSettings {
            auth: Arc::new(auth),
            session: Arc::new(SessionConfig {
                show: Arc::new(vec![(
                    "wal_segment_size".to_string(),
                    format!("{}MB", wal.segment_size() >> 20),
                )]),
                ..SessionConfig::default()
            }),
            ..WalSenderSettings::default()
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let served = wal.clone();
        let thread = std::thread::spawn(move || {
            let sys = System::new();
            sys.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                let registry = WalSenderRegistry::new(10, served.clone()).start();
                let shared = Shared::new(served, settings, acceptor, registry.clone());
                let listener = Listener::start(listener, shared, Vec::new()).expect("listen");
                let addr = listener.send(GetListenAddr).await.expect("listener");
                tx.send((System::current(), addr, registry))
                    .expect("report");
            });
            sys.run().expect("primary system");
        });
        let (system, addr, registry) = rx.recv().expect("primary started");
        Primary {
            wal,
            addr,
            registry,
            system,
            thread: Some(thread),
        }
    }

    pub fn conninfo(&self, extra: &str) -> ConnInfo {
        ConnInfo::parse(&format!(
            "host=127.0.0.1 port={} user=repl sslmode=disable {extra}",
            self.addr.port()
        ))
        .expect("conninfo")
    }

    /// Ends every walsender with FATAL 57P01, as an immediate shutdown does.
    pub async fn shutdown_walsenders(&self) {
        self.registry
            .send(ShutdownWalSenders {
                mode: ShutdownMode::Immediate,
            })
            .await
            .expect("registry");
    }

    pub async fn replication(&self) -> Vec<WalSenderStatus> {
        self.registry
            .send(GetReplicationStatus)
            .await
            .expect("registry")
    }

    /// Stops the primary's System: every socket closes without a word, as when the process
    /// is killed.
    pub fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.system.stop();
        if let Some(t) = self.thread.take() {
            t.join().expect("primary thread");
        }
    }
}

impl Drop for Primary {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Appends `n` records of `size` bytes (their bytes name their index) and waits until they
/// are durable; returns the end.
pub async fn append(wal: &Wal, n: usize, size: usize) -> Lsn {
    let records: Vec<Bytes> = (0..n)
        .map(|i| Bytes::from(vec![(i % 251) as u8; size]))
        .collect();
    let ends = wal.append(records).expect("append").await.expect("durable");
    *ends.last().expect("records")
}

/// Starts the next timeline on `wal` (off the async thread: it fsyncs); returns it and its
/// switch point.
pub async fn promote(wal: &Wal) -> (TimelineId, Lsn) {
    let wal = wal.clone();
    tokio::task::spawn_blocking(move || wal.promote("test"))
        .await
        .expect("promotion ran")
        .expect("promoted")
}

/// What the walreceiver told its owner.
#[derive(Debug)]
pub enum Event {
    Streaming(StreamingStarted),
    Stopped(Box<ReceiverStopped>),
}

/// The owner: forwards events into a channel.
pub struct Recorder(mpsc::UnboundedSender<Event>);

impl Actor for Recorder {
    type Context = Context<Self>;
}

impl Handler<StreamingStarted> for Recorder {
    type Result = ();
    fn handle(&mut self, msg: StreamingStarted, _: &mut Context<Self>) {
        let _ = self.0.send(Event::Streaming(msg));
    }
}

impl Handler<ReceiverStopped> for Recorder {
    type Result = ();
    fn handle(&mut self, msg: ReceiverStopped, _: &mut Context<Self>) {
        let _ = self.0.send(Event::Stopped(Box::new(msg)));
    }
}

/// A running walreceiver and its events.
pub struct Receiving {
    pub addr: Addr<WalReceiver>,
    pub events: mpsc::UnboundedReceiver<Event>,
    /// Events that arrived while a wait looked for something else, oldest first.
    pending: std::collections::VecDeque<Event>,
}

impl Receiving {
    pub fn start(config: ReceiverConfig, standby: &Wal) -> Receiving {
        let (tx, events) = mpsc::unbounded_channel();
        let owner = Recorder(tx).start();
        let addr = WalReceiver::new(
            ReceiverId(1),
            config,
            standby.clone(),
            ReceiverOwner::of(&owner),
        )
        .start();
        Receiving {
            addr,
            events,
            pending: Default::default(),
        }
    }

    pub async fn next_event(&mut self) -> Event {
        if let Some(e) = self.pending.pop_front() {
            return e;
        }
        tokio::time::timeout(DEADLINE, self.events.recv())
            .await
            .expect("an event within the deadline")
            .expect("the owner lives")
    }

    /// Whether an event is waiting.
    pub fn has_event(&mut self) -> bool {
        if !self.pending.is_empty() {
            return true;
        }
        match self.events.try_recv() {
            Ok(e) => {
                self.pending.push_back(e);
                true
            }
            Err(_) => false,
        }
    }

    /// The next event must be a stream beginning; returns its timeline and start.
    pub async fn streaming(&mut self) -> (TimelineId, Lsn) {
        match self.next_event().await {
            Event::Streaming(s) => (s.timeline, s.start),
            Event::Stopped(s) => panic!("stopped instead of streaming: {}", s.reason),
        }
    }

    /// The next event must be the stop; returns it.
    pub async fn stopped(&mut self) -> ReceiverStopped {
        match self.next_event().await {
            Event::Stopped(s) => *s,
            Event::Streaming(s) => panic!("streaming instead of stopping: {s:?}"),
        }
    }
}

/// Test-friendly walreceiver settings: timeouts that never fire unless a test sets them.
pub fn receiver_config(conninfo: ConnInfo) -> ReceiverConfig {
    let mut c = ReceiverConfig::new(conninfo, Some("standby_test"));
    c.session.wal_receiver_timeout = Duration::from_secs(60);
    c
}

impl Receiving {
    /// Waits until `wal` is durable up to `lsn` on `timeline`; a stop of the walreceiver
    /// meanwhile fails the test with its reason, a stream beginning is kept for later.
    pub async fn wait_flushed(&mut self, wal: &Wal, timeline: TimelineId, lsn: Lsn) {
        self.wait_flushed_within(wal, timeline, lsn, DEADLINE).await
    }

    pub async fn wait_flushed_within(
        &mut self,
        wal: &Wal,
        timeline: TimelineId,
        lsn: Lsn,
        within: Duration,
    ) {
        let mut rx = wal.subscribe();
        let deadline = tokio::time::Instant::now() + within;
        let mut kept = Vec::new();
        let reached = loop {
            tokio::select! {
                r = rx.wait_for(|p| p.timeline >= timeline && p.flushed >= lsn) => break r.is_ok(),
                e = self.events.recv() => match e {
                    Some(Event::Stopped(s)) => panic!("the walreceiver stopped: {}", s.reason),
                    Some(other) => kept.push(other),
                    None => break false,
                },
                _ = tokio::time::sleep_until(deadline) => break false,
            }
        };
        self.pending.extend(kept);
        assert!(
            reached,
            "standby did not reach {lsn} on timeline {timeline}: it is at {:?}",
            wal.position()
        );
    }
}

/// Asserts that both WALs hold the same bytes on `timeline` from `start` to `end`.
pub fn assert_same_wal(a: &Wal, b: &Wal, timeline: TimelineId, start: Lsn, end: Lsn) {
    let mut at = start;
    while at < end {
        let want = ((end.0 - at.0) as usize).min(1 << 20);
        let x = a.read(timeline, at, want).expect("read primary");
        let y = b.read(timeline, at, x.len()).expect("read standby");
        assert!(!x.is_empty(), "nothing to read at {at}");
        assert_eq!(x.len(), y.len(), "short read at {at}");
        if x != y {
            let i = x
                .iter()
                .zip(y.iter())
                .position(|(p, q)| p != q)
                .unwrap_or(0);
            panic!("WAL differs at {}", at + i as u64);
        }
        at = at + x.len() as u64;
    }
}
