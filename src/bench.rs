//! `walserver bench`: load tools for people who measure.
//!
//! `catchup` is a plain replication client built on protocol-codec: it streams a range of
//! WAL from any server that speaks PostgreSQL 15's protocol (walserver or PostgreSQL itself)
//! and throws the bytes away, so the figure is the sender's and the network's, not a disk's.

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
                ("application_name", "walserver-bench"),
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
                at = at + x.data.len() as u64;
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
