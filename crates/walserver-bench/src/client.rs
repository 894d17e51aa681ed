//! The load tool's uses of the blocking replication client (`repl_client::ReplClient`):
//! `bench catchup` streams a range of WAL from any server that speaks PostgreSQL 15's
//! protocol (walserver or PostgreSQL itself) and throws the bytes away, so the figure is the
//! sender's and the network's, not a disk's; `bench wait-lsn` asks IDENTIFY_SYSTEM until a
//! position is reached.

use std::time::Instant;

use anyhow::{bail, Context};
use protocol_codec::{BackendMessage, FrontendMessage};
use repl_client::ReplClient;
use wal_storage::Lsn;

/// Streams `[start, end)` and discards it; returns the bytes received and the seconds taken.
pub fn catchup(
    c: &mut ReplClient,
    start: Lsn,
    end: Lsn,
    timeline: Option<u32>,
) -> anyhow::Result<(u64, f64)> {
    let t = Instant::now();
    c.start_replication(start, timeline)?;
    let mut at = start;
    loop {
        match c.recv()? {
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
                    c.standby_status(at, at, at, false)?;
                }
            }
            BackendMessage::ErrorResponse(e) => {
                bail!("server error: {}", e.message().unwrap_or(""))
            }
            other => bail!("unexpected message while streaming: {other:?}"),
        }
    }
    let secs = t.elapsed().as_secs_f64();
    c.send(&FrontendMessage::CopyDone)?;
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
        match ReplClient::connect(
            (host, port),
            user,
            password.as_deref(),
            "walserver-wait-lsn",
        ) {
            Ok(c) => break c,
            Err(e) if started.elapsed() >= timeout => {
                return Err(
                    anyhow::Error::new(e).context(format!("no connection within {timeout:?}"))
                )
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(2)),
        }
    };
    let connected_s = started.elapsed().as_secs_f64();
    let mut first: Option<(Lsn, f64)> = None;
    loop {
        let pos = c.identify_system()?.xlogpos;
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
