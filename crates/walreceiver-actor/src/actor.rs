//! The WalReceiver actor: thin glue around [`Session`].
//!
//! It connects ([`crate::connect`]) in a future it owns, then reads upstream messages as a
//! stream, hears of durable WAL as a stream of [`WalPosition`]s from storage's watch channel,
//! and writes through a small bounded queue to a writer task. Storage work that touches files
//! (the session's [`crate::session::StorageOp`]s) is carried out by [`crate::storage_ops`] on
//! the tokio blocking pool of its arbiter; WAL goes to storage with `Wal::write`, which
//! only queues it for storage's writer thread. Nothing here blocks the arbiter and nothing
//! polls: every wakeup is an upstream message, a flush notification, a finished ticket or
//! storage job, a message from the owner, or one of the session's two timers.
//!
//! Backpressure: the read stream takes permits from a semaphore of `max_wal_in_flight` bytes
//! before it yields an XLogData, and each write's permits are released only when its ticket
//! resolves (the bytes are durable). The tickets are waited on in the order of the writes, by
//! one task that rides storage's position watch through the thread's relay (`Ticket::ride`):
//! a flush then wakes this thread once, for the status update and the tickets together, and
//! the first write that failed is the one the walreceiver ends on (a later write of the same
//! stream fails too, as a gap, and is not the cause). While the bound is reached the stream does not read the
//! socket, TCP's window fills, and the upstream's walsender waits; the actor meanwhile still
//! handles flush notifications, timers and `StopReceiver`. The same holds while storage's
//! archive gate is closed (the archive is behind by more than `archive_max_backlog`): the
//! stream waits on the gate's watch before it reads, and the upstream's slot keeps the WAL.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use actor_util::DeadlineTimer;
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use protocol_codec::{BackendMessage, ClientCodec, CodecError, FrontendMessage};
use tokio::io::{AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::WatchStream;
use tokio_util::codec::FramedRead;
use wal_archive::ArchiveTarget;
use wal_storage::{ArchiveBacklog, TimelineId, Wal, WalPosition, WriteTicket};

use crate::config::ReceiverConfig;
use crate::connect::{self, Connection, Io};
use crate::cutback::UpstreamRole;
use crate::error::{ReceiverError, StopReason};
use crate::gap;
use crate::low_water::{LowWater, LOW_WATER_GRACE};
use crate::messages::*;
use crate::session::{LocalWal, Output, Session};
use crate::status::{ReceiverState, ReceiverStatus};
use crate::storage_ops;

/// Messages queued for the writer task. Only status updates and the few commands of a
/// conversation go there, so a full queue means the upstream stopped reading.
const WRITE_QUEUE: usize = 64;

/// How much one read of the upstream socket may take. Asking the codec for room for one
/// message at a time costs two reads per 128 KiB XLogData (its header, then the rest) and a
/// copy of the first; with room for many, one read takes whatever the socket holds, and only
/// the message cut at the end of the room is copied into the next buffer. The size is a
/// guess: a few messages' worth, small beside the in-flight bound.
const READ_AHEAD: usize = 1 << 20;
/// How long the writer may take to deliver the last messages (a Terminate) of a stopped
/// walreceiver to an upstream that does not read; then the socket is dropped.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

pub struct WalReceiver {
    id: ReceiverId,
    config: Arc<ReceiverConfig>,
    wal: Wal,
    owner: ReceiverOwner,
    session: Session,
    writer: Option<mpsc::Sender<Bytes>>,
    writer_task: Option<tokio::task::JoinHandle<()>>,
    /// Writes whose tickets the durable task waits on, in order.
    durable: Option<mpsc::UnboundedSender<PendingWrite>>,
    in_flight: Arc<Semaphore>,
    timer: DeadlineTimer,
    stop_reason: Option<StopReason>,
    /// The connection's two streams (upstream messages, storage's positions), cancelled when
    /// the connection ends and the actor does not: before a fill from the archive.
    streams: Vec<SpawnHandle>,
    /// Counts the connections this actor made, so that a closed one's writer failing is not
    /// taken for the current one's.
    connection: u64,
}

/// A write made and not yet durable: its ticket, the permits its bytes hold, and the timeline
/// an error names.
struct PendingWrite {
    ticket: WriteTicket,
    permit: Option<OwnedSemaphorePermit>,
    timeline: TimelineId,
}

/// Waits for each write to be durable, in the order they were made, releasing its permits;
/// ends with the first that failed.
async fn wait_durable(
    mut writes: mpsc::UnboundedReceiver<PendingWrite>,
    mut pos: watch::Receiver<WalPosition>,
) -> Result<(), ReceiverError> {
    while let Some(w) = writes.recv().await {
        if let Err(e) = w.ticket.ride(&mut pos).await {
            return Err(ReceiverError::storage(e, w.timeline));
        }
        drop(w.permit);
    }
    Ok(())
}

/// An upstream message, with the in-flight permits an XLogData holds until it is durable.
struct Inbound {
    msg: BackendMessage,
    permit: Option<OwnedSemaphorePermit>,
}

impl WalReceiver {
    /// A walreceiver that will stream from `config.conninfo` into `wal` once started. `wal`
    /// must not be the last handle on the data directory: dropping the last one joins
    /// storage's threads, which would block the arbiter.
    pub fn new(
        id: ReceiverId,
        config: ReceiverConfig,
        wal: Wal,
        owner: ReceiverOwner,
    ) -> WalReceiver {
        let status = ReceiverStatus::new(
            config.conninfo.to_string_without_password(),
            config.session.slot_name.clone(),
        );
        let session = Session::new(
            Arc::new(config.session.clone()),
            LocalWal::of(&wal),
            status,
            Instant::now(),
        );
        WalReceiver {
            id,
            in_flight: Arc::new(Semaphore::new(config.max_wal_in_flight())),
            config: Arc::new(config),
            wal,
            owner,
            session,
            writer: None,
            writer_task: None,
            durable: None,
            timer: DeadlineTimer::default(),
            stop_reason: None,
            streams: Vec::new(),
            connection: 0,
        }
    }

    /// Connects (again), in a future this actor owns; the session must be new.
    fn connect(&mut self, ctx: &mut Context<Self>) {
        let config = self.config.clone();
        let timeout = connect::setup_timeout(
            &config.conninfo,
            (!config.session.wal_receiver_timeout.is_zero())
                .then_some(config.session.wal_receiver_timeout),
        );
        let connecting = async move {
            connect::connect(&config.conninfo, &config.application_name, timeout).await
        };
        ctx.spawn(connecting.into_actor(self).map(|res, act, ctx| match res {
            Ok(conn) => act.established(conn, ctx),
            Err(e) => act.fail(e, ctx),
        }));
    }

    /// Ends the connection and keeps the actor: stops reading it, and lets the writer deliver
    /// what is queued (a Terminate) and shut the socket down, within `CLOSE_GRACE`.
    fn close_connection(&mut self, ctx: &mut Context<Self>) {
        self.connection += 1;
        for h in self.streams.drain(..) {
            ctx.cancel_future(h);
        }
        self.writer = None;
        if let Some(mut task) = self.writer_task.take() {
            actix_rt::spawn(async move {
                if tokio::time::timeout(CLOSE_GRACE, &mut task).await.is_err() {
                    task.abort();
                }
            });
        }
    }

    /// The upstream refused the start because it has removed the WAL there (58P01), and this
    /// node has an archive: fill the gap from it on the blocking pool, then connect again
    /// at once from the new end. A fill that adds nothing is the stop's reason instead
    /// (`gap.rs`), so this does not loop.
    fn fill_gap(&mut self, archive: ArchiveTarget, ctx: &mut Context<Self>) {
        self.send(&FrontendMessage::Terminate);
        self.close_connection(ctx);
        self.session.status_mut().status = ReceiverState::Waiting;
        let wal = self.wal.clone();
        let upstream = self.session.upstream_timeline();
        tracing::info!(
            receiver = self.id.0,
            end = %wal.position().written,
            "the upstream has already removed the WAL this node needs; filling the gap from the archive"
        );
        let job = tokio::task::spawn_blocking(move || gap::fill(&archive, &wal, upstream));
        let job = async move {
            job.await.unwrap_or_else(|e| {
                Err(ReceiverError::Archive {
                    message: format!("the fill's task ended: {e}"),
                })
            })
        };
        ctx.spawn(job.into_actor(self).map(|res, act, ctx| match res {
            Ok(f) => {
                tracing::info!(
                    receiver = act.id.0,
                    timeline = %f.timeline,
                    from = %f.from,
                    to = %f.to,
                    segments = f.segments,
                    "filled a gap from the archive; streaming again"
                );
                let mut status = act.session.status().clone();
                status.status = ReceiverState::Starting;
                act.session = Session::new(
                    Arc::new(act.config.session.clone()),
                    LocalWal::after_fill(&act.wal),
                    status,
                    Instant::now(),
                );
                act.connect(ctx);
            }
            Err(e) => {
                if let ReceiverError::OtherSystemArchive { .. } = e {
                    // The alarm's log line; the owner shows it in `/status` and `/metrics`.
                    tracing::error!(receiver = act.id.0, "{e}");
                }
                act.stop_reason.get_or_insert(StopReason::Failed(e));
                ctx.stop();
            }
        }));
    }

    fn established(&mut self, conn: Connection, ctx: &mut Context<Self>) {
        tracing::info!(
            receiver = self.id.0,
            upstream = %conn.peer,
            tls = conn.session.tls,
            server_version = conn.param("server_version").unwrap_or("?"),
            "walreceiver connected"
        );
        // A primary's end is the point its history shares with ours on its timeline; a
        // standby's is not (`cutback`).
        let role = UpstreamRole::of(conn.param("in_hot_standby"));
        let status = self.session.status_mut();
        status.sender_host = Some(conn.target.host.clone());
        status.sender_port = Some(conn.target.port);
        let (reader, writer) = tokio::io::split(conn.io);
        let codec = ClientCodec::new().with_read_ahead(READ_AHEAD);
        let mut framed = FramedRead::new(reader, codec);
        framed.read_buffer_mut().extend_from_slice(&conn.leftover);
        let messages = ctx.add_stream(inbound(
            framed,
            self.in_flight.clone(),
            self.config.max_wal_in_flight(),
            LowWater::new(conn.fd),
            self.wal.archive_backlog(),
        ));
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let me = ctx.address().downgrade();
        let connection = self.connection;
        self.writer_task = Some(actix_rt::spawn(async move {
            if let Err(e) = write_loop(writer, rx).await {
                if let Some(me) = me.upgrade() {
                    me.do_send(WriterFailed {
                        connection,
                        error: e.to_string(),
                    });
                }
            }
        }));
        self.writer = Some(tx);
        // Through the thread's relay, shared with the node's other subscribers on it.
        let positions = ctx.add_stream(WatchStream::from_changes(actor_util::relayed(
            self.wal.subscribe(),
        )));
        self.streams = vec![messages, positions];
        let mut out = Vec::new();
        self.session.on_connected(role, Instant::now(), &mut out);
        self.apply(out, None, ctx);
    }

    /// Carries out what the session asked for. `permit` belongs to the XLogData that made it.
    fn apply(
        &mut self,
        out: Vec<Output>,
        mut permit: Option<OwnedSemaphorePermit>,
        ctx: &mut Context<Self>,
    ) {
        for o in out {
            match o {
                Output::Send(m) => self.send(&m),
                Output::Write { start, data } => self.write(start, data, permit.take(), ctx),
                Output::Run(op) => {
                    let job = storage_ops::run_blocking(op, self.wal.clone());
                    ctx.spawn(job.into_actor(self).map(|res, act, ctx| {
                        let mut out = Vec::new();
                        act.session.on_storage_done(res, Instant::now(), &mut out);
                        act.apply(out, None, ctx);
                    }));
                }
                Output::Streaming { timeline, start } => {
                    tracing::info!(receiver = self.id.0, %timeline, %start, "walreceiver started streaming");
                    self.owner.streaming.do_send(StreamingStarted {
                        receiver: self.id,
                        timeline,
                        start,
                    });
                }
                Output::CommitPoint(c) => self.wal.set_told_commit_point(c),
                Output::Stop(
                    e @ (ReceiverError::BelowCommitPoint { .. }
                    | ReceiverError::WroteAsPrimary { .. }),
                ) => {
                    // The alarm: an error in the log, the refusal in storage's metrics, the
                    // reason in the owner's restart state (`/status`).
                    tracing::error!(receiver = self.id.0, "{e}");
                    self.wal.metrics().count_tail_cut_refusal();
                    self.stop_reason.get_or_insert(StopReason::Failed(e));
                    ctx.stop();
                }
                Output::Stop(e) => match &self.config.archive {
                    Some(archive)
                        if e.sqlstate() == Some("58P01") && self.stop_reason.is_none() =>
                    {
                        self.fill_gap(archive.clone(), ctx)
                    }
                    _ => {
                        self.stop_reason.get_or_insert(StopReason::Failed(e));
                        ctx.stop();
                    }
                },
            }
        }
        self.arm_timer(ctx);
    }

    fn write(
        &mut self,
        start: wal_storage::Lsn,
        data: Bytes,
        permit: Option<OwnedSemaphorePermit>,
        ctx: &mut Context<Self>,
    ) {
        let timeline = self.session.timeline();
        match self.wal.write(start, data) {
            Ok(ticket) => {
                let pending = PendingWrite {
                    ticket,
                    permit,
                    timeline,
                };
                if self.durable.is_none() {
                    // Through the thread's relay: answered by the flush's announcement, the
                    // wake-up that also carries the position to this actor's status updates.
                    let (tx, rx) = mpsc::unbounded_channel();
                    let pos = actor_util::relayed(self.wal.subscribe());
                    ctx.spawn(wait_durable(rx, pos).into_actor(self).map(|r, act, ctx| {
                        if let Err(e) = r {
                            act.fail(e, ctx);
                        }
                    }));
                    self.durable = Some(tx);
                }
                // The task ends only with this actor, or on a failure that stops it.
                if let Some(durable) = &self.durable {
                    let _ = durable.send(pending);
                }
            }
            Err(e) => self.fail(ReceiverError::storage(e, timeline), ctx),
        }
    }

    fn send(&mut self, msg: &FrontendMessage) {
        let Some(writer) = &self.writer else {
            return;
        };
        let mut buf = BytesMut::with_capacity(64);
        if let Err(e) = msg.encode(&mut buf) {
            tracing::error!(receiver = self.id.0, "cannot encode a message: {e}");
            return;
        }
        match writer.try_send(buf.freeze()) {
            Ok(()) => {}
            // Status updates supersede each other; a later one carries the same news.
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::debug!(
                    receiver = self.id.0,
                    "the upstream is not reading; a message was dropped"
                )
            }
            // The writer ended; its error arrives as WriterFailed.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    fn fail(&mut self, e: ReceiverError, ctx: &mut Context<Self>) {
        let mut out = Vec::new();
        self.session.stop(&mut out);
        self.stop_reason.get_or_insert(StopReason::Failed(e));
        ctx.stop();
    }

    /// Keeps a timer at the session's earliest deadline (status interval, ping, timeout).
    fn arm_timer(&mut self, ctx: &mut Context<Self>) {
        let deadline = self.session.next_deadline();
        self.timer.arm(deadline, ctx, |act, ctx| {
            act.timer.fired();
            let mut out = Vec::new();
            act.session.on_tick(Instant::now(), &mut out);
            act.apply(out, None, ctx);
        });
    }
}

/// The read side: upstream messages, each XLogData only once its bytes fit in the in-flight
/// bound. While it waits for permits it does not read the socket. Each XLogData sets the
/// socket's low-water mark from the WAL its upstream still promises (`low_water.rs`).
/// While the archive's backlog is past `archive_max_backlog` (storage's gate) it does not
/// read either: the upstream's slot holds the WAL meanwhile, and the gate's opening wakes it.
fn inbound(
    framed: FramedRead<ReadHalf<Box<dyn Io>>, ClientCodec>,
    permits: Arc<Semaphore>,
    max_in_flight: usize,
    low_water: LowWater,
    archive_gate: watch::Receiver<Option<ArchiveBacklog>>,
) -> impl Stream<Item = Result<Inbound, CodecError>> {
    let state = (framed, permits, low_water, archive_gate);
    futures_util::stream::unfold(
        state,
        move |(mut framed, permits, mut low_water, mut archive_gate)| async move {
            // The gate's sender lives as long as storage, which outlives this stream.
            let _ = archive_gate.wait_for(Option::is_none).await;
            let item = match next_message(&mut framed, &mut low_water).await? {
                Ok(BackendMessage::XLogData(x)) => {
                    // What is still to come from the socket: the WAL promised past this message,
                    // less what was read already (buffered bytes count in full, headers too, so
                    // this never overstates it).
                    let end = x.wal_start.0.saturating_add(x.data.len() as u64);
                    let buffered = framed.read_buffer().len() as u64;
                    low_water.follow(x.wal_end.0.saturating_sub(end).saturating_sub(buffered));
                    // A message larger than the whole bound waits for all of it.
                    let n = x.data.len().clamp(1, max_in_flight) as u32;
                    let permit = permits.clone().acquire_many_owned(n).await.ok()?;
                    Ok(Inbound {
                        msg: BackendMessage::XLogData(x),
                        permit: Some(permit),
                    })
                }
                Ok(msg) => Ok(Inbound { msg, permit: None }),
                Err(e) => Err(e),
            };
            Some((item, (framed, permits, low_water, archive_gate)))
        },
    )
}

/// The next upstream message. With the low-water mark raised, a message that does not come
/// within [`LOW_WATER_GRACE`] lowers the mark, then is waited for as usual.
async fn next_message(
    framed: &mut FramedRead<ReadHalf<Box<dyn Io>>, ClientCodec>,
    low_water: &mut LowWater,
) -> Option<Result<BackendMessage, CodecError>> {
    if !low_water.raised() {
        return framed.next().await;
    }
    // Waiting for a message is cancel-safe: what was read stays in the buffer.
    match tokio::time::timeout(LOW_WATER_GRACE, framed.next()).await {
        Ok(next) => next,
        Err(_) => {
            tracing::debug!("the upstream sent less WAL than it promised; low-water mark lowered");
            low_water.lower();
            framed.next().await
        }
    }
}

/// The write side: sends what the actor queues, gathering what is queued into one flush.
async fn write_loop(
    mut w: WriteHalf<Box<dyn Io>>,
    mut rx: mpsc::Receiver<Bytes>,
) -> std::io::Result<()> {
    while let Some(b) = rx.recv().await {
        w.write_all(&b).await?;
        while let Ok(b) = rx.try_recv() {
            w.write_all(&b).await?;
        }
        w.flush().await?;
    }
    w.shutdown().await
}

/// The writer task failed: the connection is broken.
#[derive(Message)]
#[rtype(result = "()")]
struct WriterFailed {
    connection: u64,
    error: String,
}

impl Handler<WriterFailed> for WalReceiver {
    type Result = ();

    fn handle(&mut self, msg: WriterFailed, ctx: &mut Context<Self>) {
        if msg.connection == self.connection {
            self.fail(ReceiverError::Io { message: msg.error }, ctx);
        }
    }
}

impl Actor for WalReceiver {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(64);
        self.connect(ctx);
    }

    fn stopped(&mut self, ctx: &mut Context<Self>) {
        self.close_connection(ctx);
        let reason = self
            .stop_reason
            .take()
            .unwrap_or(StopReason::ShutdownRequested);
        match &reason {
            StopReason::ShutdownRequested => {
                tracing::info!(receiver = self.id.0, "walreceiver stopped")
            }
            // Debug only: the owner hears the reason with the stop event and decides how loudly
            // to report it (the supervisor logs a run of failures, not each one).
            StopReason::Failed(e) => {
                tracing::debug!(receiver = self.id.0, "walreceiver stopped: {e}")
            }
        }
        self.owner.stopped.do_send(ReceiverStopped {
            receiver: self.id,
            reason,
            status: self.session.status().clone(),
        });
    }
}

impl StreamHandler<Result<Inbound, CodecError>> for WalReceiver {
    fn handle(&mut self, item: Result<Inbound, CodecError>, ctx: &mut Context<Self>) {
        match item {
            Ok(Inbound { msg, permit }) => {
                let mut out = Vec::new();
                self.session.on_message(msg, Instant::now(), &mut out);
                self.apply(out, permit, ctx);
            }
            Err(e) => self.fail(e.into(), ctx),
        }
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        if !self.session.is_closed() {
            self.fail(
                ReceiverError::UpstreamClosed {
                    detail: String::new(),
                },
                ctx,
            );
        }
    }
}

impl StreamHandler<WalPosition> for WalReceiver {
    fn handle(&mut self, pos: WalPosition, ctx: &mut Context<Self>) {
        #[cfg(feature = "failpoints")]
        if (self.session.status().flushed_lsn).is_some_and(|f| pos.flushed > f) {
            wal_storage::crash::reached(crate::CRASH_REPLY);
        }
        let mut out = Vec::new();
        self.session.on_position(pos, Instant::now(), &mut out);
        self.apply(out, None, ctx);
    }

    fn finished(&mut self, _: &mut Context<Self>) {
        // Storage stopped publishing (it is shutting down); the owner stops us as part of
        // the same shutdown.
    }
}

impl Handler<StopReceiver> for WalReceiver {
    type Result = ();

    fn handle(&mut self, _: StopReceiver, ctx: &mut Context<Self>) {
        let mut out = Vec::new();
        self.session.stop(&mut out);
        self.stop_reason
            .get_or_insert(StopReason::ShutdownRequested);
        for o in out {
            if let Output::Send(m) = o {
                self.send(&m);
            }
        }
        ctx.stop();
    }
}

impl Handler<GetReceiverStatus> for WalReceiver {
    type Result = MessageResult<GetReceiverStatus>;

    fn handle(&mut self, _: GetReceiverStatus, _: &mut Context<Self>) -> Self::Result {
        let mut status = self.session.status().clone();
        // Storage's own position is newer than the last notification the stream delivered.
        if status.flushed_lsn.is_some() {
            let pos = self.wal.position();
            status.flushed_lsn = Some(pos.flushed);
            status.received_tli = Some(pos.timeline);
        }
        MessageResult(status)
    }
}

impl Handler<Applied> for WalReceiver {
    type Result = ();

    fn handle(&mut self, msg: Applied, ctx: &mut Context<Self>) {
        let mut out = Vec::new();
        self.session.on_applied(msg.lsn, Instant::now(), &mut out);
        self.apply(out, None, ctx);
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;

    use bytes::BytesMut;
    use protocol_codec::messages::{PrimaryKeepalive, XLogData};
    use tokio::io::AsyncWriteExt;
    use wal_storage::{Lsn, PgTimestamp};

    use super::*;

    /// While the in-flight bound is reached the read side neither yields WAL nor reads the
    /// socket: the upstream's writes block once the (small) pipe is full. Releasing permits
    /// (durability) lets it go on.
    #[tokio::test]
    async fn the_read_side_stops_reading_at_the_in_flight_bound() {
        const CHUNK: usize = 100 << 10;
        let (ours, mut upstream) = tokio::io::duplex(16 << 10);
        let (reader, _writer) = tokio::io::split(Box::new(ours) as Box<dyn Io>);
        let permits = Arc::new(Semaphore::new(250 << 10));
        let mut stream = pin!(inbound(
            FramedRead::new(reader, ClientCodec::new()),
            permits.clone(),
            250 << 10,
            LowWater::new(None),
            watch::channel(None).1,
        ));
        let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = sent.clone();
        let upstream_task = tokio::spawn(async move {
            for i in 0..10u64 {
                let mut buf = BytesMut::new();
                BackendMessage::XLogData(XLogData {
                    wal_start: Lsn(i * CHUNK as u64),
                    wal_end: Lsn(0),
                    send_time: PgTimestamp(0),
                    data: Bytes::from(vec![i as u8; CHUNK]),
                })
                .encode(&mut buf)
                .unwrap();
                upstream.write_all(&buf).await.unwrap();
                counter.store(i as usize + 1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        // Two chunks fit in 250 KiB; the third does not.
        let first = stream.next().await.unwrap().unwrap();
        let second = stream.next().await.unwrap().unwrap();
        assert_eq!(permits.available_permits(), 50 << 10);
        // Let both sides run until nothing moves: the third chunk waits for room.
        for _ in 0..100 {
            let polled = futures_util::poll!(stream.next());
            assert!(polled.is_pending(), "the third chunk waits for room");
            tokio::task::yield_now().await;
        }
        // The upstream is stuck in its fourth write at most: the socket is not being read.
        assert!(sent.load(std::sync::atomic::Ordering::SeqCst) <= 3);
        assert!(!upstream_task.is_finished());
        // The first chunk becomes durable: its permits come back, and the third goes through.
        drop(first);
        let third = stream.next().await.unwrap().unwrap();
        assert!(
            matches!(third.msg, BackendMessage::XLogData(ref x) if x.wal_start == Lsn(2 * CHUNK as u64))
        );
        drop((second, third));
        let mut n = 3;
        while let Some(item) = stream.next().await {
            drop(item.unwrap());
            n += 1;
            if n == 10 {
                break;
            }
        }
        upstream_task.await.unwrap();
    }

    /// While the archive's backlog gate is closed the read side does not read the socket at
    /// all; its opening, and nothing else, lets the stream go on.
    #[tokio::test]
    async fn the_read_side_stops_reading_while_the_archive_is_behind() {
        let (ours, mut upstream) = tokio::io::duplex(16 << 10);
        let (reader, _writer) = tokio::io::split(Box::new(ours) as Box<dyn Io>);
        let (gate, gate_rx) = watch::channel(Some(ArchiveBacklog {
            backlog: 2,
            bound: 1,
        }));
        let mut stream = pin!(inbound(
            FramedRead::new(reader, ClientCodec::new()),
            Arc::new(Semaphore::new(1 << 20)),
            1 << 20,
            LowWater::new(None),
            gate_rx,
        ));
        let mut buf = BytesMut::new();
        BackendMessage::XLogData(XLogData {
            wal_start: Lsn(0),
            wal_end: Lsn(0),
            send_time: PgTimestamp(0),
            data: Bytes::from(vec![7u8; 32 << 10]),
        })
        .encode(&mut buf)
        .unwrap();
        let writer = tokio::spawn(async move {
            upstream.write_all(&buf).await.unwrap();
            upstream
        });
        for _ in 0..100 {
            let polled = futures_util::poll!(stream.next());
            assert!(
                polled.is_pending(),
                "nothing is read while the gate is closed"
            );
            tokio::task::yield_now().await;
        }
        // 32 KiB do not fit the 16 KiB pipe: the upstream is still writing.
        assert!(!writer.is_finished());
        gate.send_replace(None);
        let first = stream.next().await.unwrap().unwrap();
        assert!(matches!(first.msg, BackendMessage::XLogData(ref x) if x.data.len() == 32 << 10));
        drop(writer.await.unwrap());
    }

    /// An upstream's end of a loopback connection and the read side over ours, as
    /// `established` builds it (read-ahead, low-water mark, 32 MiB in flight).
    async fn streaming_socket() -> (
        tokio::net::TcpStream,
        std::pin::Pin<Box<impl Stream<Item = Result<Inbound, CodecError>>>>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ours = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (upstream, _) = listener.accept().await.unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&ours);
        let (reader, _writer) = tokio::io::split(Box::new(ours) as Box<dyn Io>);
        let codec = ClientCodec::new().with_read_ahead(READ_AHEAD);
        let stream = Box::pin(inbound(
            FramedRead::new(reader, codec),
            Arc::new(Semaphore::new(32 << 20)),
            32 << 20,
            LowWater::new(Some(fd)),
            watch::channel(None).1,
        ));
        (upstream, stream)
    }

    /// A catch-up over a real socket with the read-ahead and the low-water mark: every
    /// message arrives, the last one too, which the upstream sends only once the reader has
    /// drained the others (so the reader waits for it below the catch-up mark) and after
    /// which it sends nothing more and keeps the connection open.
    #[tokio::test]
    async fn a_catch_up_delivers_its_last_bytes_with_the_low_water_mark() {
        const CHUNK: usize = 128 << 10;
        const N: u64 = 64;
        let (mut upstream, mut stream) = streaming_socket().await;
        let end = N * CHUNK as u64;
        let frame = move |i: u64| {
            let mut buf = BytesMut::new();
            BackendMessage::XLogData(XLogData {
                wal_start: Lsn(i * CHUNK as u64),
                wal_end: Lsn(end),
                send_time: PgTimestamp(0),
                data: Bytes::from(vec![i as u8; CHUNK]),
            })
            .encode(&mut buf)
            .unwrap();
            buf
        };
        let (drained_tx, drained) = tokio::sync::oneshot::channel::<()>();
        let upstream_task = tokio::spawn(async move {
            for i in 0..N - 1 {
                upstream.write_all(&frame(i)).await.unwrap();
            }
            drained.await.unwrap();
            upstream.write_all(&frame(N - 1)).await.unwrap();
            // Nothing more, and the connection stays open until the test ends.
            upstream
        });
        let received = |i: u64, item: Inbound| match item.msg {
            BackendMessage::XLogData(x) => {
                assert_eq!(x.wal_start, Lsn(i * CHUNK as u64));
                assert!(x.data.iter().all(|&b| b == i as u8));
            }
            other => panic!("unexpected {other:?}"),
        };
        let all = async {
            for i in 0..N - 1 {
                received(i, stream.next().await.unwrap().unwrap());
            }
            drained_tx.send(()).unwrap();
            received(N - 1, stream.next().await.unwrap().unwrap());
        };
        tokio::time::timeout(std::time::Duration::from_secs(30), all)
            .await
            .expect("the last messages were held back");
        drop(upstream_task.await.unwrap());
    }

    /// An upstream that promises much more WAL than it then sends (a promoted cascading
    /// standby ends its stream below the end it advertised): what it does send still arrives,
    /// once the mark's grace has run out.
    #[tokio::test]
    async fn a_broken_promise_costs_the_grace_not_a_stall() {
        let (mut upstream, mut stream) = streaming_socket().await;
        let mut buf = BytesMut::new();
        BackendMessage::XLogData(XLogData {
            wal_start: Lsn(0),
            wal_end: Lsn(64 << 20),
            send_time: PgTimestamp(0),
            data: Bytes::from(vec![7u8; 8192]),
        })
        .encode(&mut buf)
        .unwrap();
        upstream.write_all(&buf).await.unwrap();
        let first = stream.next().await.unwrap().unwrap();
        assert!(matches!(first.msg, BackendMessage::XLogData(_)));
        // The promise is broken: one keepalive, then nothing, the connection open.
        let mut buf = BytesMut::new();
        BackendMessage::PrimaryKeepalive(PrimaryKeepalive {
            wal_end: Lsn(8192),
            send_time: PgTimestamp(0),
            reply_requested: true,
        })
        .encode(&mut buf)
        .unwrap();
        upstream.write_all(&buf).await.unwrap();
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
            .await
            .expect("the keepalive was held back by the low-water mark");
        assert!(matches!(
            next.unwrap().unwrap().msg,
            BackendMessage::PrimaryKeepalive(_)
        ));
    }
}
