//! The WalSender actor: one per replication connection, thin glue around [`Session`].
//!
//! It runs the startup phase ([`crate::connection::handshake`]) as a future it owns, then
//! reads client messages as a stream (`FramedRead` with `ServerCodec`), hears of new durable
//! WAL as a stream of [`WalPosition`]s from storage's watch channel, and writes through the
//! bounded frame queue of [`crate::writer`]. The session's storage effects (WAL reads, file
//! commands) are carried out by [`crate::storage_ops`], on the tokio blocking pool of the
//! actor's arbiter. Nothing here polls: every wakeup is a client message,
//! a flush notification, a finished read, room in the queue, or a real timer (keepalive,
//! wal_sender_timeout, shutdown deadline).
//!
//! It stops when the client leaves or sends Terminate, on a FATAL, on wal_sender_timeout, at
//! shutdown (after draining, for a fast shutdown of a streaming connection), or when the
//! socket fails; in each case it writes what is queued (within `close_grace`) and tells the
//! registry it is gone.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use actor_util::DeadlineTimer;
use bytes::{Bytes, BytesMut};
use protocol_codec::messages::XLogData;
use protocol_codec::{BackendMessage, CodecError, ErrorFields, FrontendMessage, ServerCodec};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_util::codec::FramedRead;
use wal_storage::{Lsn, Wal, WalError, WalPosition};

use crate::connection::{self, Established, KeepaliveTiming};
use crate::messages::*;
use crate::session::{invalid_message_type, Output, Session, ShutdownMode, WalData, MAX_SEND_SIZE};
use crate::shared::{Authenticating, Shared};
use crate::storage_ops;
use crate::writer::{frame_queue_with_files, Frame, FrameSender, QueueError};

pub struct WalSender {
    pid: u32,
    peer: SocketAddr,
    shared: Arc<Shared>,
    /// Until the startup phase ends: the socket, and the channel that tells the handshake
    /// future to stop.
    stream: Option<TcpStream>,
    handshake_shutdown: Option<watch::Sender<Option<ShutdownMode>>>,
    session: Option<Session<Wal>>,
    frames: Option<FrameSender>,
    /// Frames that did not fit in the queue, in order; drained first when there is room.
    overflow: VecDeque<Frame>,
    /// Small messages gathered into one frame.
    pending: BytesMut,
    /// Messages that arrived while a blocking command ran.
    held: VecDeque<FrontendMessage>,
    waiting_for_room: bool,
    timer: DeadlineTimer,
    closing: bool,
    /// The writer task; aborted if it cannot deliver the last bytes within `close_grace`.
    writer_task: Option<tokio::task::JoinHandle<()>>,
    /// The writer can send WAL straight from segment files (plain TCP, not TLS).
    sendfile: bool,
    /// Counts the connection as in the startup phase until the handshake ends.
    authenticating: Option<Authenticating>,
    /// The socket's keepalive timing, which a reload of the node's may change.
    keepalive: Option<KeepaliveTiming>,
}

impl WalSender {
    /// A walsender for an accepted connection; with `None` it stops as soon as it starts.
    pub fn new(
        pid: u32,
        stream: Option<TcpStream>,
        peer: SocketAddr,
        shared: Arc<Shared>,
    ) -> WalSender {
        let counted = stream.as_ref().map(|_| Authenticating::start(&shared));
        WalSender::accepted(pid, stream, peer, shared, counted)
    }

    /// [`WalSender::new`] for a connection the listener counted when it accepted it.
    pub(crate) fn accepted(
        pid: u32,
        stream: Option<TcpStream>,
        peer: SocketAddr,
        shared: Arc<Shared>,
        authenticating: Option<Authenticating>,
    ) -> WalSender {
        WalSender {
            pid,
            peer,
            shared,
            stream,
            handshake_shutdown: None,
            session: None,
            frames: None,
            overflow: VecDeque::new(),
            pending: BytesMut::new(),
            held: VecDeque::new(),
            waiting_for_room: false,
            timer: DeadlineTimer::default(),
            closing: false,
            writer_task: None,
            sendfile: false,
            authenticating,
            keepalive: None,
        }
    }

    /// Room in the queue, in WAL bytes, for the session's next read.
    fn room(&self) -> usize {
        if !self.overflow.is_empty() || self.closing {
            return 0;
        }
        self.frames
            .as_ref()
            .map_or(0, |f| f.capacity() * MAX_SEND_SIZE)
    }

    fn established(&mut self, est: Established, ctx: &mut Context<Self>) {
        let (reader, writer) = tokio::io::split(est.io);
        let mut framed = FramedRead::new(reader, ServerCodec::new());
        framed.read_buffer_mut().extend_from_slice(&est.leftover);
        ctx.add_stream(framed);
        self.sendfile = est.file_socket.is_some();
        let (frames, drain) = frame_queue_with_files(writer, est.file_socket);
        let me = ctx.address();
        self.writer_task = Some(actix_rt::spawn(async move {
            let result = drain.await;
            me.do_send(WriterEnded(result.err().map(|e| e.to_string())));
        }));
        self.frames = Some(frames);
        let settings = self.shared.settings();
        self.keepalive = Some(est.keepalive);
        let mut session = Session::new(
            self.shared.wal.clone(),
            settings.session.clone(),
            est.status,
        )
        .with_user(&est.identity.user)
        .with_client_settings(est.identity.settings)
        .with_socket_values(est.socket_show);
        session.set_role(settings.in_hot_standby, settings.read_only);
        self.session = Some(session);
        // Through the thread's relay: a flush wakes this thread once for all its walsenders.
        ctx.add_stream(WatchStream::from_changes(actor_util::relayed(
            self.shared.wal.subscribe(),
        )));
    }

    /// Carries out what the session asked for.
    fn apply(&mut self, out: Vec<Output>, ctx: &mut Context<Self>) {
        for o in out {
            match o {
                Output::Msg(m) => {
                    if let Err(e) = m.encode(&mut self.pending) {
                        tracing::error!(pid = self.pid, "cannot encode a message: {e}");
                    }
                }
                Output::Wal(x) => {
                    self.flush_pending();
                    match x.framed_header() {
                        Ok(h) => self.queue(Frame::with_body(Bytes::copy_from_slice(&h), x.data)),
                        Err(e) => tracing::error!(pid = self.pid, "cannot encode XLogData: {e}"),
                    }
                }
                Output::WalFile {
                    wal_start,
                    wal_end,
                    send_time,
                    range,
                } => {
                    self.flush_pending();
                    match XLogData::framed_header_for(wal_start, wal_end, send_time, range.len) {
                        Ok(h) => self.queue(Frame::with_file(Bytes::copy_from_slice(&h), range)),
                        Err(e) => tracing::error!(pid = self.pid, "cannot encode XLogData: {e}"),
                    }
                }
                Output::Read {
                    timeline,
                    start,
                    len,
                } => {
                    let read =
                        storage_ops::read(&self.shared.wal, timeline, start, len, self.sendfile);
                    ctx.spawn(read.into_actor(self).map(move |res, act, ctx| {
                        act.on_read(start, res, ctx);
                    }));
                }
                Output::Run(op) => {
                    let run = storage_ops::run_blocking(op, self.shared.wal.clone());
                    ctx.spawn(run.into_actor(self).map(|result, act, ctx| {
                        let mut out = Vec::new();
                        if let Some(s) = act.session.as_mut() {
                            s.on_storage_done(result, &mut out);
                        }
                        act.apply(out, ctx);
                        act.release_held(ctx);
                    }));
                }
                Output::StatusChanged => {
                    self.shared
                        .registry
                        .do_send(StatusChanged { pid: self.pid });
                }
                Output::Close => self.close(ctx),
            }
        }
        self.flush_pending();
        self.arm_timer(ctx);
    }

    fn flush_pending(&mut self) {
        if !self.pending.is_empty() {
            let head = self.pending.split().freeze();
            self.queue(Frame::new(head));
        }
    }

    fn queue(&mut self, frame: Frame) {
        let Some(frames) = &self.frames else {
            return;
        };
        if !self.overflow.is_empty() {
            self.overflow.push_back(frame);
            return;
        }
        match frames.try_send(frame) {
            Ok(()) => {}
            Err((QueueError::Full, f)) => self.overflow.push_back(f),
            Err((QueueError::Closed, _)) => {}
        }
    }

    /// Moves overflow into the queue and lets the session read more, or waits for room.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        while let Some(f) = self.overflow.pop_front() {
            let Some(frames) = &self.frames else {
                self.overflow.clear();
                return;
            };
            match frames.try_send(f) {
                Ok(()) => {}
                Err((QueueError::Full, f)) => {
                    self.overflow.push_front(f);
                    break;
                }
                Err((QueueError::Closed, _)) => {
                    self.overflow.clear();
                    return;
                }
            }
        }
        if self.overflow.is_empty() && !self.closing {
            let room = self.room();
            let mut out = Vec::new();
            if let Some(s) = self.session.as_mut() {
                s.pump(room, &mut out);
            }
            if !out.is_empty() {
                self.apply(out, ctx);
            }
        }
        self.wait_for_room_if_needed(ctx);
    }

    /// If the queue is full while there is more to send, ask to be woken when it drains.
    fn wait_for_room_if_needed(&mut self, ctx: &mut Context<Self>) {
        let Some(frames) = &self.frames else {
            return;
        };
        let starved = !self.overflow.is_empty()
            || (frames.capacity() == 0 && self.session.as_ref().is_some_and(Session::is_streaming));
        if starved && !self.waiting_for_room {
            self.waiting_for_room = true;
            ctx.spawn(frames.ready().into_actor(self).map(|(), act, ctx| {
                act.waiting_for_room = false;
                act.pump(ctx);
            }));
        }
    }

    fn on_read(&mut self, start: Lsn, res: Result<WalData, WalError>, ctx: &mut Context<Self>) {
        let room = self.room();
        let mut out = Vec::new();
        if let Some(s) = self.session.as_mut() {
            s.on_wal_read(start, res, Instant::now(), room, &mut out);
        }
        self.apply(out, ctx);
        self.wait_for_room_if_needed(ctx);
    }

    fn release_held(&mut self, ctx: &mut Context<Self>) {
        while let Some(m) = self.held.pop_front() {
            if self.session.as_ref().is_none_or(Session::is_busy) {
                self.held.push_front(m);
                return;
            }
            self.handle_message(m, ctx);
        }
    }

    fn handle_message(&mut self, msg: FrontendMessage, ctx: &mut Context<Self>) {
        let Some(session) = self.session.as_mut() else {
            return;
        };
        if session.is_busy() {
            self.held.push_back(msg);
            return;
        }
        #[cfg(feature = "failpoints")]
        if let FrontendMessage::StandbyStatusUpdate(r) = &msg {
            if r.write > self.shared.wal.position().flushed {
                wal_storage::crash::reached(crate::overlap::CRASH_SENT_EARLY);
            }
        }
        let mut out = Vec::new();
        session.on_message(msg, Instant::now(), &mut out);
        self.apply(out, ctx);
        self.wait_for_room_if_needed(ctx);
    }

    /// Keeps a timer at the session's earliest deadline (keepalive, timeout, shutdown).
    fn arm_timer(&mut self, ctx: &mut Context<Self>) {
        let deadline = self.session.as_ref().and_then(Session::next_deadline);
        self.timer.arm(deadline, ctx, |act, ctx| {
            act.timer.fired();
            let mut out = Vec::new();
            if let Some(s) = act.session.as_mut() {
                s.on_tick(Instant::now(), &mut out);
            }
            act.apply(out, ctx);
            act.arm_timer(ctx);
        });
    }

    /// Ends the connection: stop reading, let the writer deliver what is queued, then stop.
    fn close(&mut self, ctx: &mut Context<Self>) {
        if self.closing {
            return;
        }
        self.closing = true;
        // Overflow frames are dropped: a closing connection owes the client only what was
        // already queued, and then its last messages (in `pending`: a FATAL, say).
        self.overflow.clear();
        let last = self.pending.split().freeze();
        // Dropping the sender lets the writer finish: it writes what is queued, flushes and
        // shuts the socket down, then reports WriterEnded.
        let frames = self.frames.take();
        if self.writer_task.is_none() {
            ctx.stop();
            return;
        }
        if let (Some(frames), false) = (frames, last.is_empty()) {
            match frames.try_send(Frame::new(last)) {
                Ok(()) | Err((QueueError::Closed, _)) => {}
                // A client in the middle of a catch-up has the queue full of WAL. Dropping the
                // last messages then would end its connection without a word (no 57P01 at
                // shutdown), so they wait for room like the WAL before them; the sender goes
                // with them, and `close_grace` bounds the wait as it bounds the writer.
                Err((QueueError::Full, last)) => {
                    ctx.spawn(frames.send_last(last).into_actor(self).map(|_, _, _| ()));
                }
            }
        }
        let grace = self.shared.settings().close_grace;
        ctx.run_later(grace, |act, ctx| {
            if let Some(t) = act.writer_task.take() {
                t.abort();
            }
            ctx.stop();
        });
    }
}

/// The writer task ended: all written after a close, or the socket failed.
#[derive(Message)]
#[rtype(result = "()")]
struct WriterEnded(Option<String>);

impl Handler<WriterEnded> for WalSender {
    type Result = ();

    fn handle(&mut self, msg: WriterEnded, ctx: &mut Context<Self>) {
        if let Some(e) = msg.0 {
            tracing::debug!(pid = self.pid, peer = %self.peer, "connection write failed: {e}");
        }
        self.writer_task = None;
        ctx.stop();
    }
}

impl Actor for WalSender {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(256);
        // First of all: the registry must know of this connection before it hears that it
        // authenticated or closed. Sent from here, in order with those events; sent by the
        // listener (another thread) it could arrive after them, and then the walsender was
        // missing from pg_stat_replication, or a connection already closed stayed registered
        // and a shutdown waited for it forever.
        self.shared.registry.do_send(ConnectionOpened {
            pid: self.pid,
            addr: ctx.address(),
        });
        let Some(stream) = self.stream.take() else {
            ctx.stop();
            return;
        };
        let (tx, rx) = watch::channel(None);
        self.handshake_shutdown = Some(tx);
        let hs = connection::handshake(stream, self.peer, self.pid, self.shared.clone(), rx);
        ctx.spawn(hs.into_actor(self).map(|res, act, ctx| {
            act.handshake_shutdown = None;
            act.authenticating = None;
            match res {
                Ok(est) => act.established(est, ctx),
                Err(_) => ctx.stop(),
            }
        }));
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        // Dropping the session releases its slot and drops its temporary slots.
        self.session = None;
        self.shared
            .registry
            .do_send(ConnectionClosed { pid: self.pid });
    }
}

impl StreamHandler<Result<FrontendMessage, CodecError>> for WalSender {
    fn handle(&mut self, item: Result<FrontendMessage, CodecError>, ctx: &mut Context<Self>) {
        if self.closing {
            return;
        }
        match item {
            Ok(msg) => self.handle_message(msg, ctx),
            Err(e) => {
                tracing::debug!(pid = self.pid, peer = %self.peer, "protocol violation: {e}");
                let fatal = match e {
                    CodecError::UnknownMessageType { tag, .. } => invalid_message_type(
                        tag,
                        self.session.as_ref().is_some_and(Session::is_streaming),
                    ),
                    _ => ErrorFields::fatal(e.sqlstate(), e.to_string()),
                };
                if let Err(e) = BackendMessage::ErrorResponse(fatal).encode(&mut self.pending) {
                    tracing::error!("cannot encode an error: {e}");
                }
                self.close(ctx);
            }
        }
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        // The client closed its end: nothing more can be said to it.
        self.close(ctx);
    }
}

impl StreamHandler<WalPosition> for WalSender {
    fn handle(&mut self, pos: WalPosition, ctx: &mut Context<Self>) {
        if self.closing {
            return;
        }
        let room = self.room();
        let mut out = Vec::new();
        if let Some(s) = self.session.as_mut() {
            s.on_wal_position(pos, room, &mut out);
        }
        if !out.is_empty() {
            self.apply(out, ctx);
        }
        self.wait_for_room_if_needed(ctx);
    }

    fn finished(&mut self, _: &mut Context<Self>) {
        // Storage stopped publishing (it is shutting down); the connection goes on until the
        // supervisor's shutdown reaches it.
    }
}

impl Handler<Shutdown> for WalSender {
    type Result = ();

    fn handle(&mut self, msg: Shutdown, ctx: &mut Context<Self>) {
        if let Some(tx) = &self.handshake_shutdown {
            let _ = tx.send(Some(msg.mode));
            return;
        }
        if self.closing {
            return;
        }
        let room = self.room();
        let mut out = Vec::new();
        match self.session.as_mut() {
            Some(s) => s.shutdown(msg.mode, room, &mut out),
            None => return ctx.stop(),
        }
        self.apply(out, ctx);
        self.wait_for_room_if_needed(ctx);
    }
}

impl Handler<SettingsChanged> for WalSender {
    type Result = ();

    fn handle(&mut self, _: SettingsChanged, ctx: &mut Context<Self>) {
        let settings = self.shared.settings();
        if let Some(s) = self.session.as_mut() {
            s.set_config(settings.session.clone());
            s.set_role(settings.in_hot_standby, settings.read_only);
            if let Some(values) = self
                .keepalive
                .as_mut()
                .and_then(|k| k.reload(&settings.tcp_keepalives))
            {
                s.set_socket_values(values);
            }
        }
        self.arm_timer(ctx);
    }
}
