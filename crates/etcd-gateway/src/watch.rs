//! [`Watch`]: a long-lived `POST /v3/watch` read on its own thread.
//!
//! The request body is one `create_request`; the answer is a chunked stream of JSON messages,
//! one per line (see `wire`). The first says the watch was created (with the revision it
//! starts after); every later one is a batch of events, a progress notice (no events), or a
//! cancellation (`canceled`, with `compact_revision` when the start revision was compacted).
//! [`Client::watch`] reads the first message under the call's deadline, so once it returns
//! the watch is registered and no later change is missed; then a thread reads the rest with
//! no deadline (a quiet key sends nothing) and hands each batch to the callback. The stream's
//! end, a cancellation and a bad message end the watch with one last `Err`. Dropping the
//! [`Watch`] shuts the socket down, which wakes the thread's read, and joins it: no callback
//! runs after the drop returns.

use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Instant;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::client::{read_error, Client};
use crate::error::{Error, Result};
use crate::http::Body;
use crate::types::{Header, KeyRange, KeyValue};
use crate::wire::{de_int, int, StreamMessage};

const PATH: &str = "/v3/watch";
/// The largest watch message accepted. A guess: etcd caps a gRPC message at about 2 MiB by
/// default and fragments bigger batches only when asked, so 64 MiB is a wide margin.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// What to watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchRequest {
    pub range: KeyRange,
    /// The first revision to report (inclusive); 0 for changes after now.
    pub start_revision: i64,
    /// Also send each event's previous key-value.
    pub prev_kv: bool,
    /// Ask for periodic progress notices (batches with no events).
    pub progress_notify: bool,
}

impl WatchRequest {
    pub fn new(range: KeyRange) -> WatchRequest {
        WatchRequest {
            range,
            start_revision: 0,
            prev_kv: false,
            progress_notify: false,
        }
    }

    pub fn from_revision(mut self, revision: i64) -> WatchRequest {
        self.start_revision = revision;
        self
    }

    fn to_json(&self) -> Value {
        let mut create = Map::new();
        if let Value::Object(range) = self.range.to_json() {
            create.extend(range);
        }
        if self.start_revision != 0 {
            create.insert("start_revision".into(), int(self.start_revision).into());
        }
        if self.prev_kv {
            create.insert("prev_kv".into(), true.into());
        }
        if self.progress_notify {
            create.insert("progress_notify".into(), true.into());
        }
        json!({ "create_request": create })
    }
}

/// Whether an event put or deleted its key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EventKind {
    #[default]
    Put,
    Delete,
}

impl<'de> Deserialize<'de> for EventKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<EventKind, D::Error> {
        match Option::<String>::deserialize(d)?.as_deref() {
            None | Some("PUT") => Ok(EventKind::Put),
            Some("DELETE") => Ok(EventKind::Delete),
            Some(other) => Err(serde::de::Error::custom(format!(
                "unknown event type {other:?}"
            ))),
        }
    }
}

/// One change. `kv.mod_revision` is the revision of the change; a DELETE's `kv` has only the
/// key and that revision.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: EventKind,
    pub kv: KeyValue,
    pub prev_kv: Option<KeyValue>,
}

/// One message of the stream: events in revision order (none for a progress notice).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchBatch {
    pub header: Header,
    pub events: Vec<Event>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WatchResponse {
    header: Header,
    #[serde(deserialize_with = "de_int")]
    watch_id: i64,
    created: bool,
    canceled: bool,
    #[serde(deserialize_with = "de_int")]
    compact_revision: i64,
    cancel_reason: String,
    events: Vec<Event>,
}

/// A running watch; dropping it ends it.
#[derive(Debug)]
pub struct Watch {
    created: Header,
    watch_id: i64,
    socket: TcpStream,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watch {
    /// The header of the creation message: events are those after `revision` (or from the
    /// request's start revision).
    pub fn created(&self) -> &Header {
        &self.created
    }

    pub fn watch_id(&self) -> i64 {
        self.watch_id
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wakes the thread's blocked read with an error (or the end of the stream).
        let _ = self.socket.shutdown(Shutdown::Both);
        if let Some(thread) = self.thread.take() {
            // A callback that drops its own watch must not wait for itself.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

impl Client {
    /// Starts a watch; `on_batch` gets each batch on the watch's thread, then at most one
    /// `Err` when the watch ends by itself ([`Error::WatchEnded`], [`Error::Compacted`],
    /// [`Error::WatchCanceled`], or a read or decode error). Nothing is delivered after the
    /// [`Watch`] is dropped. The drop waits for a callback in progress, so the callback must
    /// not wait for the thread that drops the watch (an unbounded channel never does).
    pub fn watch<F>(&self, request: &WatchRequest, mut on_batch: F) -> Result<Watch>
    where
        F: FnMut(Result<WatchBatch>) + Send + 'static,
    {
        let deadline = Instant::now() + self.request_timeout();
        let (endpoint, mut body) = self.open(PATH, &request.to_json(), Some(deadline))?;
        let first = read_response(&mut body, &endpoint, self.request_timeout())?
            .ok_or(Error::WatchEnded)?;
        if let Some(end) = ended(&first) {
            return Err(end);
        }
        if !first.created {
            return Err(Error::malformed(
                PATH,
                "the first message did not create the watch",
            ));
        }
        // From here on a read waits as long as the key stays quiet.
        body.set_deadline(None);
        let socket = body
            .try_clone_socket()
            .map_err(|e| read_error(e, &endpoint, PATH, self.request_timeout()))?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&stopping);
        let timeout = self.request_timeout();
        let thread = std::thread::Builder::new()
            .name("etcd-watch".into())
            .spawn(move || loop {
                let message = read_response(&mut body, &endpoint, timeout);
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let response = match message {
                    Ok(Some(response)) => response,
                    Ok(None) => return on_batch(Err(Error::WatchEnded)),
                    Err(e) => return on_batch(Err(e)),
                };
                if let Some(end) = ended(&response) {
                    return on_batch(Err(end));
                }
                on_batch(Ok(WatchBatch {
                    header: response.header,
                    events: response.events,
                }));
            })
            .map_err(|e| Error::Io {
                endpoint: self.current_endpoint().to_string(),
                path: PATH,
                source: e,
            })?;
        Ok(Watch {
            created: first.header,
            watch_id: first.watch_id,
            socket,
            stopping,
            thread: Some(thread),
        })
    }

    /// [`Client::watch`] into a channel: batches arrive on the receiver, which disconnects
    /// after the last.
    pub fn watch_channel(
        &self,
        request: &WatchRequest,
    ) -> Result<(Watch, mpsc::Receiver<Result<WatchBatch>>)> {
        let (tx, rx) = mpsc::channel();
        let watch = self.watch(request, move |batch| {
            // A receiver that has gone away wants nothing more; the watch ends on drop.
            let _ = tx.send(batch);
        })?;
        Ok((watch, rx))
    }
}

/// Reads and decodes one message; `None` at the end of the stream.
fn read_response(
    body: &mut Body,
    endpoint: &str,
    timeout: std::time::Duration,
) -> Result<Option<WatchResponse>> {
    let Some(line) = body
        .read_message(MAX_MESSAGE_BYTES)
        .map_err(|e| read_error(e, endpoint, PATH, timeout))?
    else {
        return Ok(None);
    };
    let message: StreamMessage<WatchResponse> =
        serde_json::from_slice(&line).map_err(|e| Error::malformed(PATH, e.to_string()))?;
    if let Some(error) = message.error {
        return Err(Error::Status {
            path: PATH,
            status: u16::try_from(error.http_code).unwrap_or(0),
            code: error.grpc_code,
            message: error.message,
        });
    }
    message
        .result
        .map(Some)
        .ok_or_else(|| Error::malformed(PATH, "neither result nor error"))
}

/// The error a cancellation message ends the watch with.
fn ended(response: &WatchResponse) -> Option<Error> {
    if !response.canceled {
        return None;
    }
    Some(if response.compact_revision > 0 {
        Error::Compacted {
            compact_revision: response.compact_revision,
        }
    } else {
        Error::WatchCanceled {
            reason: if response.cancel_reason.is_empty() {
                "no reason given".to_string()
            } else {
                response.cancel_reason.clone()
            },
        }
    })
}
