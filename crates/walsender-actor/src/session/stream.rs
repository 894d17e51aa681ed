//! Streaming: `START_REPLICATION`, the CopyBoth sub-protocol, and its end.
//!
//! A stream asks for one read at a time (`Output::Read`, at most [`READ_SIZE`] and no more
//! than the room the actor reports), cuts what comes back into XLogData of at most
//! [`MAX_SEND_SIZE`] ending on page boundaries, and reads on while there is flushed WAL and
//! room. Caught up, it asks for nothing until storage announces a new durable end: waiting
//! for WAL is the absence of a read in flight. The standby's replies move its positions, its
//! lags and its slot; keepalives and `wal_sender_timeout` follow its silence. A stream ends
//! when the client sends CopyDone, when a historic timeline reaches its switch point (our
//! CopyDone, then the next timeline), on an ERROR, or at shutdown (drained first, for a fast
//! one).

use std::time::Instant;

use protocol_codec::messages::{
    CommitPoint, HotStandbyFeedback, PrimaryKeepalive, StandbyStatusUpdate, XLogData,
};
use protocol_codec::{results, BackendMessage, ErrorFields, SqlState, ACCEPTS_UNFLUSHED_PARAM};
use wal_storage::{Lsn, PgTimestamp, TimelineId, WalError, WalPosition};

use super::{
    admin_shutdown, wal_error_fields, Mode, Output, Session, ShutdownMode, StorageView, Stream,
    StreamEnd, WalData, MAX_SEND_SIZE, PAGE_SIZE, READ_SIZE,
};
use crate::overlap;
use crate::status::{lock, WalSenderState};

impl Stream {
    /// Where this stream's WAL ends for now: the flushed end, or the switch point.
    fn limit(&self, flushed: Lsn) -> Lsn {
        match self.end {
            StreamEnd::Current => flushed,
            StreamEnd::Historic { switch, .. } => switch,
        }
    }
}

/// A keepalive that asks the standby for a reply; the stream then waits for one.
fn ping(stream: &mut Stream, out: &mut Vec<Output>) {
    stream.waiting_for_ping = true;
    out.push(Output::Msg(BackendMessage::PrimaryKeepalive(
        PrimaryKeepalive {
            wal_end: stream.sent,
            send_time: PgTimestamp::now(),
            reply_requested: true,
        },
    )));
}

impl<S: StorageView> Session<S> {
    pub(super) fn start_replication(
        &mut self,
        slot_name: Option<String>,
        start: Lsn,
        timeline: Option<TimelineId>,
        now: Instant,
        out: &mut Vec<Output>,
    ) {
        let slot = match &slot_name {
            Some(name) => match self.storage.acquire_slot(name, self.pid) {
                Ok(g) => Some(g),
                Err(e) => return self.error(wal_error_fields(&e), out),
            },
            None => None,
        };
        let pos = self.storage.position();
        self.position = pos;
        let tli = timeline.unwrap_or(pos.timeline);
        let end = if tli == pos.timeline {
            StreamEnd::Current
        } else {
            let history = self.storage.history();
            let Some(i) = history.iter().position(|e| e.parent == tli) else {
                return self.error(
                    ErrorFields::error(
                        SqlState::INTERNAL_ERROR,
                        format!("requested timeline {tli} is not in this server's history"),
                    ),
                    out,
                );
            };
            let switch = history[i].switch_lsn;
            let next = history.get(i + 1).map(|e| e.parent).unwrap_or(pos.timeline);
            if switch < start {
                return self.error(
                    ErrorFields::error(
                        SqlState::INTERNAL_ERROR,
                        format!("requested starting point {start} on timeline {tli} is not in this server's history"),
                    )
                    .detail(format!("This server's history forked from timeline {tli} at {switch}.")),
                    out,
                );
            }
            StreamEnd::Historic { switch, next }
        };
        let stream = Box::new(Stream {
            timeline: tli,
            end,
            sent: start,
            read_in_flight: false,
            client_done: false,
            server_done: false,
            slot,
            waiting_for_ping: false,
            last_reply: now,
            told: None,
        });
        // A historic timeline that ends exactly where the client starts has nothing to
        // stream: PostgreSQL answers with the next timeline at once, without COPY.
        if let StreamEnd::Historic { switch, next } = end {
            if start == switch {
                drop(stream);
                out.extend(
                    results::end_of_timeline(next, switch)
                        .into_iter()
                        .map(Output::Msg),
                );
                out.extend(results::end_of_streaming().into_iter().map(Output::Msg));
                return self.ready(out);
            }
        }
        out.push(Output::Msg(BackendMessage::CopyBothResponse));
        // PostgreSQL checks the start against the flushed end only once in copy mode; the
        // error ends the copy and the connection stays usable.
        if end == StreamEnd::Current && start > pos.flushed {
            drop(stream);
            return self.error(
                ErrorFields::error(
                    SqlState::INTERNAL_ERROR,
                    format!(
                        "requested starting point {start} is ahead of the WAL flush position of this server {}",
                        pos.flushed
                    ),
                ),
                out,
            );
        }
        {
            let mut st = lock(&self.status);
            st.slot_name = stream.slot.as_ref().map(|g| g.name().to_string());
            st.state = WalSenderState::Catchup;
            st.timeline = Some(tli);
            st.sent_lsn = Some(start);
        }
        self.mode = Mode::Streaming(stream);
        out.push(Output::StatusChanged);
        // The commit point first, before any WAL: a walreceiver takes a stream whose first
        // message is not one as a stream that carries none.
        self.tell_commit_point(out);
        self.pump(usize::MAX, out);
    }

    /// Tells a client that can cut back the commit point this node knows, with its flushed
    /// end, when the commit point moved (the overlapped commit's rule 3: the client serves
    /// its readers nothing past it). A move of the flushed end alone is no news to the
    /// client, which acts on the commit point only; under the overlapped commit the flushed
    /// end moves once per commit before the commit point does, and telling it cost a message
    /// and a wake-up of the standby's thread per commit. Only on the current timeline: a
    /// historic one ends at its switch.
    fn tell_commit_point(&mut self, out: &mut Vec<Output>) {
        if !overlap::carries_commit_point(
            self.config.commit_overlap,
            overlap::accepts_unflushed(self.client.get(ACCEPTS_UNFLUSHED_PARAM)),
        ) {
            return;
        }
        let now = (self.position.committed(), self.position.flushed);
        let Mode::Streaming(stream) = &mut self.mode else {
            return;
        };
        if stream.end != StreamEnd::Current
            || stream.timeline != self.position.timeline
            || stream.told.is_some_and(|(c, _)| c == now.0)
        {
            return;
        }
        stream.told = Some(now);
        out.push(Output::Msg(BackendMessage::CommitPoint(CommitPoint {
            commit_point: now.0,
            flushed: now.1,
        })));
    }

    /// The node's WAL position changed: more WAL is durable, or the timeline switched.
    pub fn on_wal_position(&mut self, pos: WalPosition, room: usize, out: &mut Vec<Output>) {
        let old_tli = self.position.timeline;
        self.position = pos;
        if let Mode::Streaming(stream) = &mut self.mode {
            if pos.timeline != old_tli
                && stream.end == StreamEnd::Current
                && stream.timeline != pos.timeline
            {
                // The timeline being streamed ended under us (promotion, or the upstream of a
                // cascading standby switched): finish it at its switch point.
                let history = self.storage.history();
                if let Some(i) = history.iter().position(|e| e.parent == stream.timeline) {
                    let next = history.get(i + 1).map(|e| e.parent).unwrap_or(pos.timeline);
                    stream.end = StreamEnd::Historic {
                        switch: history[i].switch_lsn,
                        next,
                    };
                }
            }
        }
        self.pump(room, out);
        self.tell_commit_point(out);
    }

    /// Where WAL of the current timeline ends for this stream now: the flushed end, or for a
    /// synchronous standby under the overlapped commit the written end ([`crate::overlap`]),
    /// once storage's early-send mark names the timeline: the first byte past the flushed
    /// end waits for it (rule 5), and storage's announcement that it is durable pumps again.
    fn current_end(&self) -> Lsn {
        let pos = &self.position;
        let early = overlap::sends_early(
            self.config.commit_overlap,
            overlap::accepts_unflushed(self.client.get(ACCEPTS_UNFLUSHED_PARAM)),
            &lock(&self.status).sync_state,
        ) && pos.written > pos.sendable()
            && overlap::early_sends_marked(
                self.storage.mark_early_sends(pos.timeline),
                pos.timeline,
            );
        overlap::send_limit(pos, early)
    }

    /// Asks for more WAL if the stream wants it and `room` bytes may be queued.
    pub fn pump(&mut self, room: usize, out: &mut Vec<Output>) {
        let flushed = self.current_end();
        let Mode::Streaming(stream) = &mut self.mode else {
            return;
        };
        if stream.read_in_flight || stream.client_done || stream.server_done {
            return;
        }
        let limit = stream.limit(flushed);
        if stream.sent >= limit {
            if let StreamEnd::Historic { .. } = stream.end {
                // Everything up to the switch point is out: end the copy from our side.
                stream.server_done = true;
                out.push(Output::Msg(BackendMessage::CopyDone));
            } else if lock(&self.status).state == WalSenderState::Catchup {
                lock(&self.status).state = WalSenderState::Streaming;
                out.push(Output::StatusChanged);
            }
            self.check_drained(out);
            return;
        }
        if room == 0 {
            return;
        }
        let len = (limit.0 - stream.sent.0)
            .min(READ_SIZE as u64)
            .min(room as u64) as usize;
        stream.read_in_flight = true;
        out.push(Output::Read {
            timeline: stream.timeline,
            start: stream.sent,
            len,
        });
    }

    /// A read asked for with [`Output::Read`] finished: the bytes, or where they lie.
    pub fn on_wal_read(
        &mut self,
        start: Lsn,
        result: Result<WalData, WalError>,
        now: Instant,
        room: usize,
        out: &mut Vec<Output>,
    ) {
        let flushed = self.current_end();
        let now_us = self.micros(now);
        let Mode::Streaming(stream) = &mut self.mode else {
            return;
        };
        stream.read_in_flight = false;
        if stream.client_done || stream.server_done || start != stream.sent {
            return; // The copy ended while the read ran; its bytes are not wanted.
        }
        let data = match result {
            Ok(d) => d,
            Err(e) => {
                let fields = match &e {
                    WalError::SegmentRemoved { segment } => ErrorFields::error(
                        SqlState::UNDEFINED_FILE,
                        format!("requested WAL segment {segment} has already been removed"),
                    ),
                    other => wal_error_fields(other),
                };
                self.end_stream_quietly();
                return self.error(fields, out);
            }
        };
        if data.is_empty() && start >= self.position.flushed {
            // Sent early, and the batch is no longer in memory to be read (its sync failed,
            // and the position that says so is on its way): wait for that position rather
            // than ask again at once.
            return;
        }
        let wal_end = stream.limit(flushed);
        let send_time = PgTimestamp::now();
        let mut at = start;
        let mut rest = data;
        while !rest.is_empty() {
            let mut n = rest.len().min(MAX_SEND_SIZE);
            if rest.len() > MAX_SEND_SIZE {
                // Cut on a page boundary, as PostgreSQL's XLogSendPhysical does.
                let end = (at.0 + MAX_SEND_SIZE as u64) & !(PAGE_SIZE - 1);
                if end > at.0 {
                    n = (end - at.0) as usize;
                }
            }
            out.push(match rest.split_to(n) {
                WalData::Bytes(data) => Output::Wal(XLogData {
                    wal_start: at,
                    wal_end,
                    send_time,
                    data,
                }),
                WalData::File(range) => Output::WalFile {
                    wal_start: at,
                    wal_end,
                    send_time,
                    range,
                },
            });
            at = at + n as u64;
        }
        stream.sent = at;
        lock(&self.status).sent_lsn = Some(at);
        self.lags.record_sent(at, now_us);
        self.pump(room, out);
    }

    pub(super) fn on_reply(&mut self, r: StandbyStatusUpdate, now: Instant, out: &mut Vec<Output>) {
        let now_us = self.micros(now);
        let Mode::Streaming(stream) = &mut self.mode else {
            return;
        };
        let mut st = lock(&self.status);
        st.write_lsn = Some(r.write);
        st.flush_lsn = Some(r.flush);
        st.replay_lsn = Some(r.apply);
        st.reported_on = Some(stream.timeline);
        st.reply_time = Some(r.send_time.to_system_time());
        self.lags
            .on_reply(r.write, r.flush, r.apply, stream.sent, now_us);
        st.write_lag = self.lags.write_lag;
        st.flush_lag = self.lags.flush_lag;
        st.replay_lag = self.lags.replay_lag;
        drop(st);
        if let Some(slot) = &stream.slot {
            if r.flush.is_valid() {
                if let Err(e) = self
                    .storage
                    .advance_slot(slot.name(), r.flush, stream.timeline)
                {
                    tracing::warn!(
                        slot = slot.name(),
                        "could not advance replication slot: {e}"
                    );
                }
            }
        }
        // After our CopyDone no more CopyData may follow, not even a keepalive.
        if r.reply_requested && !stream.server_done {
            out.push(Output::Msg(BackendMessage::PrimaryKeepalive(
                PrimaryKeepalive {
                    wal_end: stream.sent,
                    send_time: PgTimestamp::now(),
                    reply_requested: false,
                },
            )));
        }
        out.push(Output::StatusChanged);
        self.check_drained(out);
    }

    pub(super) fn on_feedback(&mut self, h: HotStandbyFeedback, out: &mut Vec<Output>) {
        // Recorded and shown; walserver has no snapshots for it to hold back.
        let mut st = lock(&self.status);
        st.backend_xmin = (h.xmin != 0).then_some(h.xmin);
        st.backend_xmin_epoch = (h.xmin != 0).then_some(h.xmin_epoch);
        st.reply_time = Some(h.send_time.to_system_time());
        out.push(Output::StatusChanged);
    }

    pub(super) fn on_client_copy_done(&mut self, out: &mut Vec<Output>) {
        let Mode::Streaming(stream) = &mut self.mode else {
            return;
        };
        stream.client_done = true;
        if !stream.server_done {
            stream.server_done = true;
            out.push(Output::Msg(BackendMessage::CopyDone));
        }
        if let StreamEnd::Historic { switch, next } = stream.end {
            out.extend(
                results::end_of_timeline(next, switch)
                    .into_iter()
                    .map(Output::Msg),
            );
        }
        out.extend(results::end_of_streaming().into_iter().map(Output::Msg));
        self.end_stream_quietly();
        self.ready(out);
    }

    /// Leaves streaming without a word to the client (the caller says what is needed).
    pub(super) fn end_stream_quietly(&mut self) {
        if let Mode::Streaming(_) = self.mode {
            self.mode = Mode::Idle; // Drops the stream and with it the slot guard.
            let mut st = lock(&self.status);
            st.state = WalSenderState::Startup;
            st.slot_name = None;
        }
    }

    /// When the next timer should fire, if any.
    pub fn next_deadline(&self) -> Option<Instant> {
        let timeout = self.wal_sender_timeout();
        let streaming = match &self.mode {
            Mode::Streaming(s) if !timeout.is_zero() => Some(if s.waiting_for_ping {
                s.last_reply + timeout
            } else {
                s.last_reply + timeout / 2
            }),
            _ => None,
        };
        match (streaming, self.stopping) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The timer fired.
    pub fn on_tick(&mut self, now: Instant, out: &mut Vec<Output>) {
        if let Some(deadline) = self.stopping {
            if now >= deadline && !self.is_closed() {
                tracing::warn!(
                    pid = self.pid,
                    "standby did not confirm all WAL before wal_sender_shutdown_timeout; terminating"
                );
                return self.fatal(admin_shutdown(), out);
            }
        }
        let timeout = self.wal_sender_timeout();
        let Mode::Streaming(stream) = &mut self.mode else {
            return;
        };
        if timeout.is_zero() {
            return;
        }
        if now >= stream.last_reply + timeout {
            // PostgreSQL only logs this (COMMERROR) and exits; the client is gone or stuck.
            tracing::info!(
                pid = self.pid,
                "terminating walsender due to replication timeout"
            );
            return self.close(out);
        }
        if !stream.waiting_for_ping && !stream.server_done && now >= stream.last_reply + timeout / 2
        {
            ping(stream, out);
        }
    }

    /// The server is shutting down.
    pub fn shutdown(&mut self, mode: ShutdownMode, room: usize, out: &mut Vec<Output>) {
        match (mode, &mut self.mode) {
            (_, Mode::Closed) => {}
            (ShutdownMode::Fast { deadline }, Mode::Streaming(stream)) if !stream.client_done => {
                self.stopping = Some(deadline);
                lock(&self.status).state = WalSenderState::Stopping;
                out.push(Output::StatusChanged);
                // Everything durable when the shutdown began is sent, including WAL whose
                // notification has not reached this walsender yet (the position watch and
                // this message race on the actor's thread): so the durable end comes from
                // storage itself, not from the last notification.
                let pos = self.storage.position();
                self.on_wal_position(pos, room, out);
                self.check_drained(out);
            }
            _ => self.fatal(admin_shutdown(), out),
        }
    }

    /// During a fast shutdown: once everything flushed is sent and the standby confirmed it,
    /// end the copy as PostgreSQL's WalSndDone does (CommandComplete "COPY 0", no CopyDone).
    fn check_drained(&mut self, out: &mut Vec<Output>) {
        if self.stopping.is_none() {
            return;
        }
        let flushed = self.position.flushed;
        let Mode::Streaming(stream) = &mut self.mode else {
            return;
        };
        // After our own CopyDone (a historic timeline ended) the client's CopyDone ends the
        // stream; until then, or the deadline, there is nothing to add.
        if stream.read_in_flight || stream.server_done || stream.sent < stream.limit(flushed) {
            return;
        }
        // pg_receivewal without a slot reports flush 0: use its write position then.
        let (flush, write) = {
            let st = lock(&self.status);
            (st.flush_lsn, st.write_lsn)
        };
        let replicated = match flush {
            Some(f) if f.is_valid() => f,
            _ => write.unwrap_or(Lsn::INVALID),
        };
        if replicated >= stream.sent {
            out.push(Output::Msg(BackendMessage::CommandComplete(
                "COPY 0".to_string(),
            )));
            return self.close(out);
        }
        if !stream.waiting_for_ping {
            ping(stream, out);
        }
    }
}
