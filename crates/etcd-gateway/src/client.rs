//! [`Client`]: the unary calls, endpoint failover and deadlines.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::http::{self, Body, Endpoint, HeadError};
use crate::types::{
    DeleteResponse, Header, KeyRange, Lease, LeaseId, LeaseTimeToLive, Op, PutResponse,
    RangeResponse, Status, Txn, TxnResponse,
};
use crate::wire::{int, ErrorBody, StreamMessage};

/// The default bound of a whole call: connecting, sending and reading the answer. A guess:
/// etcd answers in milliseconds, and a proposal waits up to about five seconds for a leader.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The default bound of one connection attempt (also bounded by the call's deadline). A
/// guess: a loopback or LAN connect is sub-millisecond; longer means the host is gone.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The largest answer read into memory. A guess with a wide margin: etcd refuses requests
/// over 1.5 MiB by default, but a prefix range can answer with many keys.
const MAX_RESPONSE_BYTES: u64 = 64 * 1024 * 1024;
/// The largest error body kept for the message.
const MAX_ERROR_BYTES: u64 = 64 * 1024;

/// A client of etcd's v3 JSON gateway over one or more members' client URLs. Every call is
/// blocking (run it on its own thread or a blocking pool, never on an actor's thread) and
/// takes `&self`, so one client can be shared between threads.
///
/// Failover: a call starts at the endpoint that last accepted a connection and moves to the
/// next when a connection cannot be made. Once a request has been sent it is never resent
/// elsewhere, because it may have been applied; the caller decides.
#[derive(Debug)]
pub struct Client {
    endpoints: Vec<Endpoint>,
    current: AtomicUsize,
    request_timeout: Duration,
    connect_timeout: Duration,
}

/// A copy starts at the endpoint the original would try next; `client.clone()
/// .with_request_timeout(t)` gives one call site its own deadline.
impl Clone for Client {
    fn clone(&self) -> Client {
        Client {
            endpoints: self.endpoints.clone(),
            current: AtomicUsize::new(self.current.load(Ordering::Relaxed)),
            request_timeout: self.request_timeout,
            connect_timeout: self.connect_timeout,
        }
    }
}

impl Client {
    /// A client of these endpoints (`http://host:port` or `host:port`), in order of preference.
    pub fn new<I, S>(endpoints: I) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut parsed = Vec::new();
        for text in endpoints {
            let text = text.as_ref();
            let endpoint = Endpoint::parse(text).map_err(|reason| Error::InvalidEndpoint {
                endpoint: text.to_string(),
                reason,
            })?;
            parsed.push(endpoint);
        }
        if parsed.is_empty() {
            return Err(Error::InvalidEndpoint {
                endpoint: String::new(),
                reason: "no endpoint given",
            });
        }
        Ok(Client {
            endpoints: parsed,
            current: AtomicUsize::new(0),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        })
    }

    /// Bounds every call (connect, send, answer) by `timeout`.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Client {
        self.request_timeout = timeout;
        self
    }

    /// Bounds each connection attempt by `timeout` (and by the call's deadline).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Client {
        self.connect_timeout = timeout;
        self
    }

    /// The endpoint the next call tries first.
    pub fn current_endpoint(&self) -> &str {
        &self.endpoints[self.current.load(Ordering::Relaxed) % self.endpoints.len()].url
    }

    /// The keys in `range` (one key or a prefix), at the current revision.
    pub fn range(&self, range: &KeyRange) -> Result<RangeResponse> {
        self.call("/v3/kv/range", &range.to_json())
    }

    /// Puts `value` at `key`, attached to `lease` if given.
    pub fn put(&self, key: &[u8], value: &[u8], lease: Option<LeaseId>) -> Result<PutResponse> {
        self.call("/v3/kv/put", &Op::put_json(key, value, lease))
    }

    /// Deletes the keys in `range`.
    pub fn delete_range(&self, range: &KeyRange) -> Result<DeleteResponse> {
        self.call("/v3/kv/deleterange", &range.to_json())
    }

    /// Runs a transaction; [`TxnResponse::succeeded`] says which branch ran.
    pub fn txn(&self, txn: &Txn) -> Result<TxnResponse> {
        self.call("/v3/kv/txn", &txn.to_json())
    }

    /// Grants a lease of `ttl` seconds (etcd raises it to its minimum, about 1.5 election
    /// timeouts, when lower).
    pub fn lease_grant(&self, ttl: i64) -> Result<Lease> {
        self.call("/v3/lease/grant", &json!({ "TTL": int(ttl) }))
    }

    /// Renews `id` once and returns the TTL the member reports. A lease that is gone (the
    /// member answers TTL 0) is [`Error::LeaseNotFound`]. See [`Lease`] for why a
    /// renewal is no proof of holding a key.
    pub fn lease_keepalive(&self, id: LeaseId) -> Result<Lease> {
        const PATH: &str = "/v3/lease/keepalive";
        // The gateway serves this bidirectional stream as one request message (the body),
        // then one answer message per request; the server ends the stream when the request
        // side closes, so one message is all there is.
        let (endpoint, mut body) = self.open(PATH, &json!({ "ID": int(id.0) }), None)?;
        let line = body
            .read_message(MAX_RESPONSE_BYTES as usize)
            .map_err(|e| read_error(e, &endpoint, PATH, self.request_timeout))?
            .ok_or_else(|| Error::malformed(PATH, "the stream ended without an answer"))?;
        let message: StreamMessage<Lease> =
            serde_json::from_slice(&line).map_err(|e| Error::malformed(PATH, e.to_string()))?;
        if let Some(error) = message.error {
            return Err(lease_error(
                id,
                Error::Status {
                    path: PATH,
                    status: u16::try_from(error.http_code).unwrap_or(0),
                    code: error.grpc_code,
                    message: error.message,
                },
            ));
        }
        let answer = message
            .result
            .ok_or_else(|| Error::malformed(PATH, "neither result nor error"))?;
        if answer.ttl <= 0 {
            return Err(Error::LeaseNotFound { id: id.0 });
        }
        Ok(answer)
    }

    /// Revokes `id`: its keys are deleted.
    pub fn lease_revoke(&self, id: LeaseId) -> Result<Header> {
        self.call::<HeaderOnly>("/v3/lease/revoke", &json!({ "ID": int(id.0) }))
            .map(|answer| answer.header)
            .map_err(|e| lease_error(id, e))
    }

    /// The time `id` has left, and with `keys` the keys attached to it.
    pub fn lease_time_to_live(&self, id: LeaseId, keys: bool) -> Result<LeaseTimeToLive> {
        let answer: LeaseTimeToLive = self
            .call(
                "/v3/lease/timetolive",
                &json!({ "ID": int(id.0), "keys": keys }),
            )
            .map_err(|e| lease_error(id, e))?;
        if answer.ttl < 0 {
            return Err(Error::LeaseNotFound { id: id.0 });
        }
        Ok(answer)
    }

    /// Compacts the history up to `revision`: watches from older revisions fail with
    /// [`Error::Compacted`].
    pub fn compact(&self, revision: i64) -> Result<Header> {
        self.call::<HeaderOnly>("/v3/kv/compaction", &json!({ "revision": int(revision) }))
            .map(|answer| answer.header)
    }

    /// The answering member's status: its version and the leader it knows.
    pub fn status(&self) -> Result<Status> {
        self.call("/v3/maintenance/status", &json!({}))
    }

    /// One unary call: POST `body`, read the whole answer, decode it.
    fn call<T: DeserializeOwned>(&self, path: &'static str, body: &Value) -> Result<T> {
        let (endpoint, mut answer) = self.open(path, body, None)?;
        let bytes = answer
            .read_all(MAX_RESPONSE_BYTES)
            .map_err(|e| read_error(e, &endpoint, path, self.request_timeout))?;
        serde_json::from_slice(&bytes).map_err(|e| Error::malformed(path, e.to_string()))
    }

    /// Connects (failing over between endpoints), sends the request and reads the answer's
    /// head. A non-2xx answer becomes [`Error::Status`]. The body is returned with the call's
    /// deadline on its reads, or `deadline` when given.
    pub(crate) fn open(
        &self,
        path: &'static str,
        body: &Value,
        deadline: Option<Instant>,
    ) -> Result<(String, Body)> {
        let deadline = deadline.unwrap_or_else(|| Instant::now() + self.request_timeout);
        let payload =
            serde_json::to_vec(body).map_err(|e| Error::malformed(path, e.to_string()))?;
        let count = self.endpoints.len();
        let first = self.current.load(Ordering::Relaxed);
        let mut tried = Vec::new();
        let mut last_error = None;
        for step in 0..count {
            let index = (first + step) % count;
            let endpoint = &self.endpoints[index];
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            tried.push(endpoint.url.clone());
            let stream = match endpoint.connect(left.min(self.connect_timeout)) {
                Ok(stream) => stream,
                Err(e) => {
                    last_error = Some(e);
                    continue;
                }
            };
            self.current.store(index, Ordering::Relaxed);
            let url = endpoint.url.clone();
            http::send_post(&stream, endpoint, path, &payload, deadline)
                .map_err(|e| read_error(e, &url, path, self.request_timeout))?;
            let response = match http::read_response(stream, Some(deadline)) {
                Ok(response) => response,
                Err(HeadError::Io(e)) => {
                    return Err(read_error(e, &url, path, self.request_timeout))
                }
                Err(HeadError::Malformed(reason)) => return Err(Error::malformed(path, reason)),
            };
            if !(200..300).contains(&response.status) {
                return Err(status_error(path, response.status, response.body));
            }
            return Ok((url, response.body));
        }
        match last_error {
            Some(source) => Err(Error::Connect {
                tried: tried.join(", "),
                source,
            }),
            None => Err(Error::Timeout {
                endpoint: tried.last().cloned().unwrap_or_default(),
                path,
                after_ms: self.request_timeout.as_millis(),
            }),
        }
    }
}

/// An answer that is only a header (revoke, compaction).
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct HeaderOnly {
    header: Header,
}

/// An I/O error after connecting, as a timeout or a failed connection.
pub(crate) fn read_error(
    e: std::io::Error,
    endpoint: &str,
    path: &'static str,
    timeout: Duration,
) -> Error {
    if http::is_timeout(&e) {
        Error::Timeout {
            endpoint: endpoint.to_string(),
            path,
            after_ms: timeout.as_millis(),
        }
    } else if e.kind() == std::io::ErrorKind::InvalidData {
        Error::malformed(path, e.to_string())
    } else {
        Error::Io {
            endpoint: endpoint.to_string(),
            path,
            source: e,
        }
    }
}

/// A non-2xx answer, with etcd's message when its body is the gateway's error JSON.
fn status_error(path: &'static str, status: u16, mut body: Body) -> Error {
    let bytes = body.read_all(MAX_ERROR_BYTES).unwrap_or_default();
    match serde_json::from_slice::<ErrorBody>(&bytes) {
        Ok(error) => Error::Status {
            path,
            status,
            code: error.code,
            message: if error.message.is_empty() {
                error.error
            } else {
                error.message
            },
        },
        Err(_) => Error::Status {
            path,
            status,
            code: 0,
            message: String::from_utf8_lossy(&bytes).trim().to_string(),
        },
    }
}

/// etcd's "requested lease not found" (gRPC NotFound) as [`Error::LeaseNotFound`].
fn lease_error(id: LeaseId, e: Error) -> Error {
    match e {
        Error::Status {
            code: 5,
            ref message,
            ..
        } if message.contains("lease not found") => Error::LeaseNotFound { id: id.0 },
        other => other,
    }
}

impl Client {
    pub(crate) fn request_timeout(&self) -> Duration {
        self.request_timeout
    }
}
