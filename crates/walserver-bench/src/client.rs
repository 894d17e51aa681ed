//! A plain replication client built on protocol-codec, blocking, one socket: `bench catchup`
//! streams a range of WAL from any server that speaks PostgreSQL 15's protocol (walserver or
//! PostgreSQL itself) and throws the bytes away, so the figure is the sender's and the
//! network's, not a disk's; `bench wait-lsn` asks IDENTIFY_SYSTEM until a position is reached.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use anyhow::{bail, Context};
use bytes::BytesMut;
use protocol_codec::auth::ClientAuthenticator;
use protocol_codec::messages::StandbyStatusUpdate;
use protocol_codec::{BackendMessage, ClientCodec, FrontendMessage, StartupCodec, StartupPacket};
use tokio_util::codec::{Decoder, Encoder};
use wal_storage::{Lsn, PgTimestamp};

/// A minimal blocking replication client.
pub struct ReplClient {
    stream: TcpStream,
    buf: BytesMut,
    out: BytesMut,
}

impl ReplClient {
    pub fn connect(
        host: &str,
        port: u16,
        user: &str,
        password: Option<&str>,
    ) -> anyhow::Result<ReplClient> {
        ReplClient::connect_as(host, port, user, password, "walserver-bench")
    }

    /// Connects with `application_name` (what `/status` and pg_stat_replication show).
    pub fn connect_as(
        host: &str,
        port: u16,
        user: &str,
        password: Option<&str>,
        application_name: &str,
    ) -> anyhow::Result<ReplClient> {
        let stream = TcpStream::connect((host, port))
            .with_context(|| format!("cannot connect to {host}:{port}"))?;
        stream.set_nodelay(true)?;
        let mut c = ReplClient {
            stream,
            buf: BytesMut::with_capacity(1 << 20),
            out: BytesMut::new(),
        };
        let mut out = BytesMut::new();
        StartupCodec.encode(
            StartupPacket::startup([
                ("user", user),
                ("replication", "true"),
                ("application_name", application_name),
            ]),
            &mut out,
        )?;
        c.stream.write_all(&out)?;
        let mut auth = ClientAuthenticator::new(
            user,
            password,
            protocol_codec::auth::ChannelBindingMode::NoTls,
        );
        loop {
            match c.recv()? {
                BackendMessage::Authentication(req) => {
                    if let Some(m) = auth.step(&req)? {
                        c.send(m)?;
                    }
                }
                BackendMessage::ErrorResponse(e) => {
                    bail!("server refused: {}", e.message().unwrap_or(""))
                }
                BackendMessage::ReadyForQuery(_) => return Ok(c),
                _ => {}
            }
        }
    }

    pub fn send(&mut self, m: FrontendMessage) -> anyhow::Result<()> {
        self.out.clear();
        ClientCodec::new().encode(m, &mut self.out)?;
        self.stream.write_all(&self.out)?;
        Ok(())
    }

    pub fn recv(&mut self) -> anyhow::Result<BackendMessage> {
        loop {
            if let Some(m) = ClientCodec::new().decode(&mut self.buf)? {
                return Ok(m);
            }
            self.buf.reserve(1 << 20);
            let n = {
                let spare = self.buf.spare_capacity_mut();
                // SAFETY: read() writes initialised bytes into the spare capacity and reports
                // how many; only those are exposed by set_len below.
                let spare =
                    unsafe { &mut *(spare as *mut [std::mem::MaybeUninit<u8>] as *mut [u8]) };
                self.stream.read(spare)?
            };
            if n == 0 {
                bail!("the server closed the connection");
            }
            // SAFETY: n bytes were just written by read().
            unsafe { self.buf.set_len(self.buf.len() + n) };
        }
    }

    /// IDENTIFY_SYSTEM: the server's timeline and WAL position (the flushed end on walserver;
    /// on a PostgreSQL standby, the WAL it has received and flushed or replayed).
    pub fn identify_system(&mut self) -> anyhow::Result<(u32, Lsn)> {
        self.send(FrontendMessage::Query("IDENTIFY_SYSTEM".into()))?;
        let mut row = None;
        loop {
            match self.recv()? {
                BackendMessage::DataRow(r) => {
                    let field = |i: usize| -> Option<String> {
                        let b = r.get(i).cloned().flatten()?;
                        Some(std::str::from_utf8(&b).ok()?.to_string())
                    };
                    let tli = field(1).and_then(|t| t.parse().ok());
                    let pos = field(2).and_then(|p| p.parse().ok());
                    row = tli.zip(pos);
                }
                BackendMessage::ErrorResponse(e) => {
                    bail!("IDENTIFY_SYSTEM failed: {}", e.message().unwrap_or(""))
                }
                BackendMessage::ReadyForQuery(_) => break,
                _ => {}
            }
        }
        row.context("IDENTIFY_SYSTEM gave no timeline and position")
    }
}

/// Streams `[start, end)` and discards it; returns the bytes received and the seconds taken.
pub fn catchup(
    c: &mut ReplClient,
    start: Lsn,
    end: Lsn,
    timeline: Option<u32>,
) -> anyhow::Result<(u64, f64)> {
    let q = match timeline {
        Some(t) => format!("START_REPLICATION {start} TIMELINE {t}"),
        None => format!("START_REPLICATION {start}"),
    };
    c.send(FrontendMessage::Query(q))?;
    let t = Instant::now();
    let mut at = start;
    loop {
        match c.recv()? {
            BackendMessage::CopyBothResponse => {}
            BackendMessage::XLogData(x) => {
                if x.wal_start != at {
                    bail!("XLogData at {} where {at} was expected", x.wal_start);
                }
                at = at.checked_add(x.data.len() as u64).with_context(|| {
                    format!("XLogData at {at} runs past the end of the LSN space")
                })?;
                if at >= end {
                    break;
                }
            }
            BackendMessage::PrimaryKeepalive(k) => {
                if k.reply_requested {
                    c.send(FrontendMessage::StandbyStatusUpdate(StandbyStatusUpdate {
                        write: at,
                        flush: at,
                        apply: at,
                        send_time: PgTimestamp::now(),
                        reply_requested: false,
                    }))?;
                }
            }
            BackendMessage::ErrorResponse(e) => {
                bail!("server error: {}", e.message().unwrap_or(""))
            }
            other => bail!("unexpected message while streaming: {other:?}"),
        }
    }
    let secs = t.elapsed().as_secs_f64();
    c.send(FrontendMessage::CopyDone)?;
    Ok((at.0 - start.0, secs))
}

/// What [`wait_lsn`] saw, times in seconds from its start.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WaitReport {
    pub target: Lsn,
    /// When the first connection was accepted (the server may still have been starting).
    pub connected_s: f64,
    /// The first position IDENTIFY_SYSTEM reported, and when.
    pub first_lsn: Lsn,
    pub first_s: f64,
    /// When the position reached `target`.
    pub reached_s: f64,
    /// Bytes from the first position seen to the target, over the time between them: the rate
    /// with the server's start-up left out.
    pub window_bytes: u64,
    pub window_mb_per_s: f64,
}

/// Connects (retrying while the server starts, up to `timeout`) and asks IDENTIFY_SYSTEM
/// every `interval` until the server's position reaches `target`.
///
/// This polls on purpose: it watches another process from outside, as a person with `psql`
/// would, and its only job is to time that process.
pub fn wait_lsn(
    host: &str,
    port: u16,
    user: &str,
    target: Lsn,
    timeout: std::time::Duration,
    interval: std::time::Duration,
) -> anyhow::Result<WaitReport> {
    let started = Instant::now();
    let password = std::env::var("PGPASSWORD").ok();
    let mut c = loop {
        match ReplClient::connect_as(host, port, user, password.as_deref(), "walserver-wait-lsn") {
            Ok(c) => break c,
            Err(e) if started.elapsed() >= timeout => {
                return Err(e.context(format!("no connection within {timeout:?}")))
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(2)),
        }
    };
    let connected_s = started.elapsed().as_secs_f64();
    let mut first: Option<(Lsn, f64)> = None;
    loop {
        let (_, pos) = c.identify_system()?;
        let now = started.elapsed().as_secs_f64();
        let (first_lsn, first_s) = *first.get_or_insert((pos, now));
        if pos >= target {
            let window_bytes = target.0.saturating_sub(first_lsn.0);
            let secs = now - first_s;
            return Ok(WaitReport {
                target,
                connected_s,
                first_lsn,
                first_s,
                reached_s: now,
                window_bytes,
                window_mb_per_s: if secs > 0.0 {
                    window_bytes as f64 / secs / 1e6
                } else {
                    0.0
                },
            });
        }
        if started.elapsed() >= timeout {
            bail!("the server's position is {pos}, short of {target}, after {timeout:?}");
        }
        std::thread::sleep(interval);
    }
}
