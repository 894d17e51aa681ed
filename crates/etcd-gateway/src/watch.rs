//! [`Watch`]: a long-lived `POST /v3/watch`, read as a [`Stream`] of batches.
//!
//! The request body is one `create_request`; the answer is a chunked stream of JSON messages,
//! one per line (see `wire`). The first says the watch was created (with the revision it
//! starts after); every later one is a batch of events, a progress notice (no events), or a
//! cancellation (`canceled`, with `compact_revision` when the start revision was compacted).
//! [`Client::watch`] reads the first message under the call's deadline, so once it returns
//! the watch is registered and no later change is missed; then the [`Watch`] reads the rest
//! when polled, with no deadline (a quiet key sends nothing). The stream's end, a
//! cancellation and a bad message end the watch with one last `Err`. The [`Watch`] owns the
//! connection and there is no task behind it: dropping it closes the socket, and no batch
//! exists to be delivered after the drop.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use futures_util::stream::{LocalBoxStream, Stream, StreamExt};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::client::Client;
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

/// A running watch: a [`Stream`] of batches, which ends after at most one `Err` when the
/// watch ends by itself ([`Error::WatchEnded`], [`Error::Compacted`],
/// [`Error::WatchCanceled`], or a read or decode error). Dropping it closes the connection at
/// once, which ends the watch on the server; nothing can arrive after the drop, since the
/// stream is the only reader. An actor takes it with `ctx.add_stream(watch)`.
pub struct Watch {
    created: Header,
    watch_id: i64,
    batches: LocalBoxStream<'static, Result<WatchBatch>>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("created", &self.created)
            .field("watch_id", &self.watch_id)
            .finish_non_exhaustive()
    }
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

    /// The next batch, waiting as long as the watched keys stay quiet; `None` after the last.
    pub async fn next_batch(&mut self) -> Option<Result<WatchBatch>> {
        self.batches.next().await
    }
}

impl Stream for Watch {
    type Item = Result<WatchBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.batches.as_mut().poll_next(cx)
    }
}

impl Client {
    /// Starts a watch. The future ends when etcd has created it (under the call's deadline),
    /// so no change after [`Watch::created`]'s revision is missed; the [`Watch`] then yields
    /// the batches as they come, with no deadline (a quiet key sends nothing).
    pub async fn watch(&self, request: &WatchRequest) -> Result<Watch> {
        match self.start_watch(request).await {
            Err(e) if self.forget_refused_token(&e) => self.start_watch(request).await,
            other => other,
        }
    }

    async fn start_watch(&self, request: &WatchRequest) -> Result<Watch> {
        let deadline = Instant::now() + self.request_timeout();
        let mut body = self.open(PATH, &request.to_json(), deadline).await?;
        let first = read_response(&mut body, Some(deadline))
            .await?
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
        // The body until the watch's last message; `None` once that has been handed out.
        let batches = futures_util::stream::unfold(Some(body), |body| async move {
            let mut body = body?;
            let response = match read_response(&mut body, None).await {
                Ok(Some(response)) => response,
                Ok(None) => return Some((Err(Error::WatchEnded), None)),
                Err(e) => return Some((Err(e), None)),
            };
            if let Some(end) = ended(&response) {
                return Some((Err(end), None));
            }
            let batch = WatchBatch {
                header: response.header,
                events: response.events,
            };
            Some((Ok(batch), Some(body)))
        });
        Ok(Watch {
            created: first.header,
            watch_id: first.watch_id,
            batches: batches.boxed_local(),
        })
    }
}

/// Reads and decodes one message, waiting until `deadline` (or as long as it takes); `None`
/// at the end of the stream.
async fn read_response(
    body: &mut Body,
    deadline: Option<Instant>,
) -> Result<Option<WatchResponse>> {
    let Some(line) = body.read_message(MAX_MESSAGE_BYTES, deadline).await? else {
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
