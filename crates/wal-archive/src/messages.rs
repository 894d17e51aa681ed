//! The archiver's messages: one struct each, with its result type.

use actix::Message;

use crate::status::ArchiverStatus;

/// Show the archiver's status (also on the watch [`Archiver::start`](crate::Archiver::start)
/// returns).
#[derive(Message, Clone, Copy, Debug)]
#[rtype(result = "ArchiverStatus")]
pub struct GetArchiverStatus;

/// Stop archiving: the upload in flight finishes first (so its position is stored or not,
/// never half), then the actor stops; the answer comes once it has.
#[derive(Message, Clone, Copy, Debug)]
#[rtype(result = "()")]
pub struct StopArchiver;
