//! [`Client`]: the unary calls, endpoint failover and deadlines, as futures on actix-rt.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::auth::{self, Auth, Token};
use crate::error::{Error, ErrorKind, Result};
use crate::http::{self, Body, Endpoint, SendFailure, Transport};
use crate::security::Security;
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
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;
/// The largest error body kept for the message.
const MAX_ERROR_BYTES: usize = 64 * 1024;

/// A client of etcd's v3 JSON gateway over one or more members' client URLs. Every call is
/// an `async fn` whose future runs on actix-rt (an arbiter, or a `System`): it awaits the
/// network and never blocks the thread. The futures are not `Send` (awc's connections live
/// on the thread that made them); the client itself is `Send + Sync` and cheap to clone, so an
/// actor clones it into each future it spawns.
///
/// Failover: a call starts at the endpoint that last accepted a connection and moves to the
/// next when a connection cannot be made. Once a request has been sent it is never resent
/// elsewhere, because it may have been applied; the caller decides. Clones share which
/// endpoint is current, so what one call learns the next call of any clone uses.
///
/// With a user ([`Security::username`]) every call carries etcd's auth token, got from
/// `/v3/auth/authenticate` before the first call and shared by the clones. etcd forgets a
/// token when it expires (`--auth-token-ttl` after its last use, for simple tokens) or
/// otherwise no longer knows it; a call that etcd refuses for its token is one etcd did not apply, so the
/// client authenticates again and sends it once more, to the same endpoint.
#[derive(Clone, Debug)]
pub struct Client {
    endpoints: Arc<[Endpoint]>,
    current: Arc<AtomicUsize>,
    request_timeout: Duration,
    connect_timeout: Duration,
    tls: Option<Arc<rustls::ClientConfig>>,
    client_cert: bool,
    auth: Option<Arc<Auth>>,
    /// Failed calls by kind, shared by the clones (every one counted once, where it failed).
    errors: Arc<ErrorCounts>,
}

/// Failed calls by [`ErrorKind`], in `ErrorKind::ALL`'s order.
#[derive(Debug, Default)]
struct ErrorCounts([AtomicU64; ErrorKind::ALL.len()]);

impl ErrorCounts {
    fn count<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(e) = &result {
            let i = ErrorKind::ALL
                .iter()
                .position(|k| *k == e.kind())
                .expect("every kind is in ALL");
            self.0[i].fetch_add(1, Ordering::Relaxed);
        }
        result
    }
}

impl Client {
    /// A client of these endpoints (`http://host:port` or `host:port`), in order of preference,
    /// without TLS or authentication.
    pub fn new<I, S>(endpoints: I) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Client::with_security(endpoints, &Security::default())
    }

    /// A client of these endpoints with TLS and a user as `security` says. `https://`
    /// endpoints need its CA file; with one, a `host:port` endpoint is spoken to over TLS
    /// too. Reads the PEM files here (blocking file I/O, once); nothing is sent until the
    /// first call.
    pub fn with_security<I, S>(endpoints: I, security: &Security) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let tls = security.client_config()?;
        let mut parsed = Vec::new();
        for text in endpoints {
            let text = text.as_ref();
            let invalid = |reason| Error::InvalidEndpoint {
                endpoint: text.to_string(),
                reason,
            };
            let endpoint = Endpoint::parse(text, tls.is_some()).map_err(invalid)?;
            if endpoint.tls() && tls.is_none() {
                return Err(invalid(
                    "https:// needs the CA certificate that signs etcd's certificates",
                ));
            }
            parsed.push(endpoint);
        }
        if parsed.is_empty() {
            return Err(Error::InvalidEndpoint {
                endpoint: String::new(),
                reason: "no endpoint given",
            });
        }
        Ok(Client {
            endpoints: parsed.into(),
            current: Arc::new(AtomicUsize::new(0)),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            tls,
            client_cert: security.cert.is_some(),
            errors: Arc::default(),
            auth: security
                .credentials()?
                .map(|(user, password)| Arc::new(Auth::new(user, password))),
        })
    }

    /// Bounds every call (connect, send, answer) by `timeout`; `client.clone()
    /// .with_request_timeout(t)` gives one call site its own deadline.
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
    pub async fn range(&self, range: &KeyRange) -> Result<RangeResponse> {
        self.call("/v3/kv/range", &range.to_json()).await
    }

    /// Puts `value` at `key`, attached to `lease` if given.
    pub async fn put(
        &self,
        key: &[u8],
        value: &[u8],
        lease: Option<LeaseId>,
    ) -> Result<PutResponse> {
        self.call("/v3/kv/put", &Op::put_json(key, value, lease))
            .await
    }

    /// Deletes the keys in `range`.
    pub async fn delete_range(&self, range: &KeyRange) -> Result<DeleteResponse> {
        self.call("/v3/kv/deleterange", &range.to_json()).await
    }

    /// Runs a transaction; [`TxnResponse::succeeded`] says which branch ran.
    pub async fn txn(&self, txn: &Txn) -> Result<TxnResponse> {
        self.call("/v3/kv/txn", &txn.to_json()).await
    }

    /// Grants a lease of `ttl` seconds (etcd raises it to its minimum, about 1.5 election
    /// timeouts, when lower).
    pub async fn lease_grant(&self, ttl: i64) -> Result<Lease> {
        self.call("/v3/lease/grant", &json!({ "TTL": int(ttl) }))
            .await
    }

    /// Renews `id` once and returns the TTL the member reports. A lease that is gone (the
    /// member answers TTL 0) is [`Error::LeaseNotFound`]. See [`Lease`] for why a
    /// renewal is no proof of holding a key.
    pub async fn lease_keepalive(&self, id: LeaseId) -> Result<Lease> {
        match self.keepalive_once(id).await {
            Err(e) if self.forget_refused_token(&e) => self.keepalive_once(id).await,
            other => other,
        }
    }

    async fn keepalive_once(&self, id: LeaseId) -> Result<Lease> {
        const PATH: &str = "/v3/lease/keepalive";
        // The gateway serves this bidirectional stream as one request message (the body),
        // then one answer message per request; the server ends the stream when the request
        // side closes, so one message is all there is.
        let deadline = Instant::now() + self.request_timeout;
        let mut body = self
            .open(PATH, &json!({ "ID": int(id.0) }), deadline)
            .await?;
        let line = body
            .read_message(MAX_RESPONSE_BYTES, Some(deadline))
            .await?
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
    pub async fn lease_revoke(&self, id: LeaseId) -> Result<Header> {
        self.call::<HeaderOnly>("/v3/lease/revoke", &json!({ "ID": int(id.0) }))
            .await
            .map(|answer| answer.header)
            .map_err(|e| lease_error(id, e))
    }

    /// The time `id` has left, and with `keys` the keys attached to it.
    pub async fn lease_time_to_live(&self, id: LeaseId, keys: bool) -> Result<LeaseTimeToLive> {
        let answer: LeaseTimeToLive = self
            .call(
                "/v3/lease/timetolive",
                &json!({ "ID": int(id.0), "keys": keys }),
            )
            .await
            .map_err(|e| lease_error(id, e))?;
        if answer.ttl < 0 {
            return Err(Error::LeaseNotFound { id: id.0 });
        }
        Ok(answer)
    }

    /// Compacts the history up to `revision`: watches from older revisions fail with
    /// [`Error::Compacted`].
    pub async fn compact(&self, revision: i64) -> Result<Header> {
        self.call::<HeaderOnly>("/v3/kv/compaction", &json!({ "revision": int(revision) }))
            .await
            .map(|answer| answer.header)
    }

    /// The answering member's status: its version and the leader it knows.
    pub async fn status(&self) -> Result<Status> {
        self.call("/v3/maintenance/status", &json!({})).await
    }

    /// The auth token the next call sends, for tests of its renewal.
    #[cfg(feature = "testkit")]
    pub fn auth_token(&self) -> Option<String> {
        self.auth
            .as_ref()
            .and_then(|auth| auth.token())
            .and_then(|token| token.header().map(str::to_string))
    }

    /// One call as JSON, for the testkit's administration (users, roles, auth).
    #[cfg(feature = "testkit")]
    pub(crate) async fn call_json(&self, path: &'static str, body: &Value) -> Result<Value> {
        self.call(path, body).await
    }

    /// One unary call: POST `body`, read the whole answer, decode it.
    async fn call<T: DeserializeOwned>(&self, path: &'static str, body: &Value) -> Result<T> {
        let deadline = Instant::now() + self.request_timeout;
        let mut answer = self.open(path, body, deadline).await?;
        let read = async {
            let bytes = answer.read_all(MAX_RESPONSE_BYTES, deadline).await?;
            serde_json::from_slice(&bytes).map_err(|e| Error::malformed(path, e.to_string()))
        };
        self.errors.count(read.await)
    }

    /// How many calls failed since this client (or the one it was cloned from) was made, by
    /// kind: every kind, in [`ErrorKind::ALL`]'s order. A call counts once, whatever retry
    /// it made inside.
    pub fn error_counts(&self) -> Vec<(ErrorKind, u64)> {
        ErrorKind::ALL
            .iter()
            .zip(&self.errors.0)
            .map(|(k, n)| (*k, n.load(Ordering::Relaxed)))
            .collect()
    }

    /// Checks that etcd takes this client's TLS settings and password: one status call
    /// (after authenticating, with a user). [`Error::is_refused_credentials`] tells a
    /// refusal from etcd being away.
    pub async fn check_access(&self) -> Result<()> {
        self.status().await.map(|_| ())
    }

    /// Sends the request with the auth token (authenticating first when there is none) and
    /// waits for the answer's head, all before `deadline`. A non-2xx answer becomes
    /// [`Error::Status`]. A request etcd refused for its token was not applied: it is sent
    /// once more with a fresh token, to the endpoint that refused it and no other.
    pub(crate) async fn open(
        &self,
        path: &'static str,
        body: &Value,
        deadline: Instant,
    ) -> Result<Body> {
        self.errors
            .count(self.open_uncounted(path, body, deadline).await)
    }

    async fn open_uncounted(
        &self,
        path: &'static str,
        body: &Value,
        deadline: Instant,
    ) -> Result<Body> {
        let payload = Bytes::from(
            serde_json::to_vec(body).map_err(|e| Error::malformed(path, e.to_string()))?,
        );
        let Some(auth) = &self.auth else {
            return self
                .send(path, &payload, deadline, None, None)
                .await
                .map_err(|f| f.error);
        };
        let token = match auth.token() {
            Some(token) => token,
            None => self.authenticate(auth, deadline).await?,
        };
        match self
            .send(path, &payload, deadline, token.header(), None)
            .await
        {
            Err(Failure {
                error,
                at: Some(index),
            }) if auth::refused_token(&error) => {
                auth.forget(&token);
                let fresh = self.authenticate(auth, deadline).await?;
                self.send(path, &payload, deadline, fresh.header(), Some(index))
                    .await
                    .map_err(|f| f.error)
            }
            other => other.map_err(|f| f.error),
        }
    }

    /// Whether etcd refused a stream's request (a watch's creation, a keepalive) for its
    /// token, which it then did not act on: the token is forgotten, so that the request can
    /// be sent once more and authenticate anew first. Unary calls do this in [`Client::open`].
    pub(crate) fn forget_refused_token(&self, e: &Error) -> bool {
        let Some(auth) = &self.auth else {
            return false;
        };
        if !auth::refused_token(e) {
            return false;
        }
        if let Some(token) = auth.token() {
            auth.forget(&token);
        }
        true
    }

    /// Gets a token for `auth`'s user and keeps it for the next calls.
    async fn authenticate(&self, auth: &Auth, deadline: Instant) -> Result<Token> {
        const PATH: &str = "/v3/auth/authenticate";
        let payload = Bytes::from(
            serde_json::to_vec(&auth.request())
                .map_err(|e| Error::malformed(PATH, e.to_string()))?,
        );
        let answer = match self.send(PATH, &payload, deadline, None, None).await {
            Ok(mut body) => body.read_all(MAX_RESPONSE_BYTES, deadline).await?,
            Err(failure) => return auth.refused(failure.error),
        };
        auth.accept(&answer)
    }

    /// Connects (failing over between endpoints, or only to endpoint `only`), sends the
    /// request and waits for the answer's head, all before `deadline`. A failure names the
    /// endpoint that answered, if one did.
    async fn send(
        &self,
        path: &'static str,
        payload: &Bytes,
        deadline: Instant,
        token: Option<&str>,
        only: Option<usize>,
    ) -> Result<Body, Failure> {
        let count = self.endpoints.len();
        let first = only.unwrap_or_else(|| self.current.load(Ordering::Relaxed));
        let steps = if only.is_some() { 1 } else { count };
        let transport = Transport {
            connect_timeout: self.connect_timeout,
            tls: self.tls.as_ref(),
            client_cert: self.client_cert,
            token,
        };
        let mut tried = Vec::new();
        let mut last_error = None;
        let mut tls_error = None;
        for step in 0..steps {
            let index = (first + step) % count;
            let endpoint = &self.endpoints[index];
            if Instant::now() >= deadline {
                break;
            }
            tried.push(endpoint.url.clone());
            let sent = http::post(
                endpoint,
                path,
                payload.clone(),
                &transport,
                deadline,
                self.request_timeout,
            )
            .await;
            let (status, mut answer) = match sent {
                Ok(answer) => answer,
                Err(SendFailure::NotSent(e)) => {
                    last_error = Some(e);
                    continue;
                }
                Err(SendFailure::Tls(e)) => {
                    tls_error = Some(e);
                    continue;
                }
                Err(SendFailure::Failed(error)) => {
                    self.current.store(index, Ordering::Relaxed);
                    return Err(Failure { error, at: None });
                }
            };
            self.current.store(index, Ordering::Relaxed);
            if !(200..300).contains(&status) {
                // The message is a courtesy: a body that does not come in time is left out.
                let bytes = answer
                    .read_all(MAX_ERROR_BYTES, deadline)
                    .await
                    .unwrap_or_default();
                return Err(Failure {
                    error: status_error(&endpoint.url, path, status, &bytes),
                    at: Some(index),
                });
            }
            return Ok(answer);
        }
        // A refused handshake says more than the endpoints that could not be reached.
        let error = match (tls_error, last_error) {
            (Some(tls), _) => tls,
            (None, Some(source)) => Error::Connect {
                tried: tried.join(", "),
                source,
            },
            (None, None) => Error::Timeout {
                endpoint: tried.last().cloned().unwrap_or_default(),
                path,
                after_ms: self.request_timeout.as_millis(),
            },
        };
        Err(Failure { error, at: None })
    }
}

/// A request that got no usable answer, and the endpoint that answered it with an error
/// status, if one did.
struct Failure {
    error: Error,
    at: Option<usize>,
}

/// An answer that is only a header (revoke, compaction).
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct HeaderOnly {
    header: Header,
}

/// etcd's refusal, through the gateway, of a client certificate with a Common Name (etcd
/// 3.4.10 and later, with `--client-cert-auth`): over gRPC etcd takes that name as the user,
/// through the gateway it cannot, so it refuses the request in plain text.
const GATEWAY_REFUSES_CN: &str = "CommonName of client sending a request against gateway";

/// A non-2xx answer, with etcd's message when its body is the gateway's error JSON.
fn status_error(endpoint: &str, path: &'static str, status: u16, bytes: &[u8]) -> Error {
    let text = String::from_utf8_lossy(bytes);
    if text.contains(GATEWAY_REFUSES_CN) {
        return Error::Tls {
            endpoint: endpoint.to_string(),
            reason: "etcd refused this client's certificate because its subject has a Common Name (CN), which etcd's JSON gateway does not take: use a client certificate without one".into(),
            source: std::io::Error::other(text.trim().to_string()),
        };
    }
    match serde_json::from_slice::<ErrorBody>(bytes) {
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
            message: String::from_utf8_lossy(bytes).trim().to_string(),
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
