//! The actix messages of walreceiver-actor. Commands are imperatives, events are in the past
//! tense; each has an explicit result type.

use actix::dev::ToEnvelope;
use actix::prelude::*;
use wal_storage::{Lsn, TimelineId};

use crate::error::StopReason;
use crate::status::ReceiverStatus;

/// Which walreceiver an event comes from: chosen by the owner when it starts one, so that it
/// can tell a late event of a walreceiver it has already replaced from one of the current.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct ReceiverId(pub u64);

/// Owner → WalReceiver: stop now (shutdown, promotion, a new `primary_conninfo`). The socket
/// is closed at once (after a Terminate); [`ReceiverStopped`] with
/// [`StopReason::ShutdownRequested`] confirms it.
#[derive(Message, Clone, Copy, Debug)]
#[rtype(result = "()")]
pub struct StopReceiver;

/// Anyone → WalReceiver: the facts of `pg_stat_wal_receiver`.
#[derive(Message, Clone, Copy, Debug)]
#[rtype(result = "ReceiverStatus")]
pub struct GetReceiverStatus;

/// Application → WalReceiver: WAL up to `lsn` has been applied. From the first of these on,
/// status updates report it as the apply position instead of the flush position.
#[derive(Message, Clone, Copy, Debug)]
#[rtype(result = "()")]
pub struct Applied {
    pub lsn: Lsn,
}

/// WalReceiver → owner: a stream began at `start` on `timeline`: the upstream accepted
/// START_REPLICATION and its first WAL or keepalive arrived (the walreceiver asks for one at
/// once). Sent after connecting and again after each timeline switch. An upstream may still
/// refuse right after (58P01 inside the copy, racing its keepalive), so a restart policy
/// should count a run as healthy only after a stable period, not at this event.
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct StreamingStarted {
    pub receiver: ReceiverId,
    pub timeline: TimelineId,
    pub start: Lsn,
}

/// WalReceiver → owner: it has stopped, and why. `status` is its last status, for showing
/// while no walreceiver runs.
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct ReceiverStopped {
    pub receiver: ReceiverId,
    pub reason: StopReason,
    pub status: ReceiverStatus,
}

/// Where a walreceiver reports: any actor that handles both events.
#[derive(Clone)]
pub struct ReceiverOwner {
    pub streaming: Recipient<StreamingStarted>,
    pub stopped: Recipient<ReceiverStopped>,
}

impl ReceiverOwner {
    pub fn of<A>(addr: &Addr<A>) -> ReceiverOwner
    where
        A: Actor + Handler<StreamingStarted> + Handler<ReceiverStopped>,
        A::Context: ToEnvelope<A, StreamingStarted> + ToEnvelope<A, ReceiverStopped>,
    {
        ReceiverOwner {
            streaming: addr.clone().recipient(),
            stopped: addr.clone().recipient(),
        }
    }
}
