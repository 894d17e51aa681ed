//! The HTTP admin API (actix-web): `/status`, `/slots`, `/metrics`, `/wal`, `/promote`,
//! `/reload`, and automatic failover's (`/cluster`, `/primary`, `/replica` and the others of
//! [`crate::failover`]).
//!
//! [`configure`] gives the node's routes to mount in an application's own `App`; [`start`] runs
//! them as the stand-alone server `walserver run` serves, with `/promote` and `/reload`. The
//! stand-alone server listens on loopback by default. Bound anywhere else it requires
//! `http_auth_token`, sent as `Authorization: Bearer ...`; with a certificate configured it
//! serves TLS.

use std::fmt::Write as _;
use std::net::SocketAddr;

use actix_web::body::MessageBody;
use actix_web::dev::{ServerHandle, ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::middleware::{from_fn, Next};
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use anyhow::Context;
use bytes::Bytes;
use futures_util::future::LocalBoxFuture;
use serde::Serialize;
use subtle::ConstantTimeEq;
use supervisor_actor::{
    check_records_start, AppendError, AppendRecords, Durability, GetNodeStatus, Node, Promote,
    PromoteError, RecordsFrom, RecordsStart,
};
use wal_storage::{Lsn, SlotInfo, TimelineId};
use walserver_node::config::Settings;

use crate::failover::{FailoverSlot, FailoverState};
use walserver_node::records::{join_records, split_records, RECORDS_CONTENT_TYPE};

/// What `POST /reload` does: re-read the configuration and apply it to the node, answering
/// with the settings whose change waits for a restart. The admin API is handed the action,
/// not the reloader behind it (`walserver run` makes it from its `Reloader`), so it knows
/// nothing of where a configuration comes from.
pub type ReloadAction = std::sync::Arc<
    dyn Fn() -> LocalBoxFuture<'static, anyhow::Result<walserver_node::node::PendingRestart>>
        + Send
        + Sync,
>;

pub struct HttpConfig {
    pub addr: SocketAddr,
    pub token: Option<String>,
    pub tls: Option<std::sync::Arc<tokio_rustls::rustls::ServerConfig>>,
    /// What `POST /reload` does; without it the endpoint answers 501.
    pub reload: Option<ReloadAction>,
    /// Where the failover endpoints find the failover actor; `None` without failover.
    pub failover: Option<FailoverSlot>,
    /// The archiver's status, shown as `/status`'s `archiver`; `None` without archiving.
    pub archiver: Option<tokio::sync::watch::Receiver<wal_archive::ArchiverStatus>>,
}

impl HttpConfig {
    pub fn from_settings(s: &Settings, addr: SocketAddr) -> anyhow::Result<HttpConfig> {
        let tls = match (&s.ssl_cert_file, &s.ssl_key_file) {
            (Some(c), Some(k)) => Some(protocol_codec::tls::server_config(c, k)?),
            _ => None,
        };
        Ok(HttpConfig {
            addr,
            token: s.http_auth_token.clone().filter(|t| !t.is_empty()),
            tls,
            reload: None,
            failover: s.failover.as_ref().map(|_| FailoverSlot::default()),
            archiver: None,
        })
    }
}

/// Starts the admin API the settings describe on `addr` (their `http_listen`, or another
/// address) and hands it to the node's supervisor; with a `[failover]` table, then starts the
/// failover actor, which must know the admin API's address. Returns the address it listens on.
pub fn serve(
    settings: &Settings,
    addr: SocketAddr,
    node: &Node,
    reload: Option<ReloadAction>,
) -> anyhow::Result<SocketAddr> {
    let mut cfg = HttpConfig::from_settings(settings, addr)?;
    cfg.reload = reload;
    // The archiver is the node's (it stops in the node's shutdown order); its status is shown
    // here.
    cfg.archiver = walserver_node::archive::start_archiver(settings, node)?.map(|(_, s)| s);
    let slot = cfg.failover.clone();
    let addr = start(cfg, node.clone())?.supervise(node);
    if let Some(slot) = slot {
        crate::failover::start(settings, node, addr, &slot)?;
    }
    Ok(addr)
}

pub struct HttpServerHandle {
    pub addr: SocketAddr,
    pub handle: ServerHandle,
    /// The server's task: it ends when the server stops, with its error if it failed.
    pub task: actix_rt::task::JoinHandle<std::io::Result<()>>,
}

impl HttpServerHandle {
    /// Hands the admin API to the node's supervisor, which stops it in the node's shutdown
    /// order (after the walsenders and the walreceiver, so `/status` shows their drain) and
    /// shows in status if it ends on its own. Returns its address.
    pub fn supervise(self, node: &Node) -> SocketAddr {
        let HttpServerHandle { addr, handle, task } = self;
        node.supervisor.do_send(supervisor_actor::SuperviseService {
            name: "admin API".into(),
            ended: Box::pin(async move {
                match task.await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(format!("the admin API failed: {e}")),
                    Err(e) => Err(format!("the admin API's task ended: {e}")),
                }
            }),
            stop: Box::new(move || Box::pin(async move { handle.stop(true).await })),
        });
        addr
    }
}

struct State {
    node: Node,
    token: Option<String>,
    reload: Option<ReloadAction>,
    archiver: Option<tokio::sync::watch::Receiver<wal_archive::ArchiverStatus>>,
    /// The failover actor, for `/metrics`' failover families; `None` without failover.
    failover: Option<FailoverSlot>,
}

/// The admin API of `node` as routes to mount in an application's own actix-web `App` or
/// `Scope`: `GET /status`, `GET /slots`, `GET /metrics`, `GET /wal` and `POST /wal`, the same
/// handlers the stand-alone server runs. It brings no bearer-token check (the application
/// guards its own routes) and no `/promote` or `/reload`, which stay the stand-alone
/// server's.
///
/// ```no_run
/// use actix_web::{web, App, HttpServer};
/// use supervisor_actor::NodeBuilder;
///
/// # async fn serve() -> anyhow::Result<()> {
/// let node = NodeBuilder::primary("/var/lib/app/wal").start().await?;
/// HttpServer::new(move || {
///     App::new()
///         .route("/", web::get().to(|| async { "my application" }))
///         // GET /walserver/status and the others.
///         .service(web::scope("/walserver").configure(walserver::http::configure(node.clone())))
/// })
/// .bind("127.0.0.1:8080")?
/// .run()
/// .await?;
/// # Ok(())
/// # }
/// ```
pub fn configure(node: Node) -> impl FnOnce(&mut web::ServiceConfig) {
    let state = web::Data::new(State {
        node,
        token: None,
        reload: None,
        archiver: None,
        failover: None,
    });
    move |cfg| node_routes(cfg, state)
}

/// The routes [`configure`] mounts, with the state their handlers read.
fn node_routes(cfg: &mut web::ServiceConfig, state: web::Data<State>) {
    cfg.app_data(state)
        .route("/status", web::get().to(status))
        .route("/slots", web::get().to(slots))
        .route("/metrics", web::get().to(metrics))
        .service(
            web::resource("/wal")
                .route(web::post().to(append))
                .route(web::get().to(read_wal)),
        );
}

/// Starts the stand-alone admin API in the current actix System: the routes of
/// [`configure`], `POST /promote`, `POST /reload` and the failover endpoints, behind the
/// bearer-token check.
pub fn start(cfg: HttpConfig, node: Node) -> anyhow::Result<HttpServerHandle> {
    let failover = web::Data::new(FailoverState {
        node: node.clone(),
        failover: cfg.failover.clone(),
    });
    let state = web::Data::new(State {
        node,
        token: cfg.token,
        reload: cfg.reload,
        archiver: cfg.archiver,
        failover: cfg.failover,
    });
    let server = HttpServer::new(move || {
        let (state, failover) = (state.clone(), failover.clone());
        App::new()
            .wrap(from_fn(check_token))
            .configure(|cfg| node_routes(cfg, state))
            .configure(|cfg| crate::failover::routes(cfg, failover))
            .route("/promote", web::post().to(promote))
            .route("/reload", web::post().to(reload))
            .default_service(web::to(no_such_endpoint))
    })
    .workers(1)
    // A graceful stop waits for requests in flight; a `GET /wal?follow=true` reader never
    // finishes by itself, so it is cut after this long. A guess: longer than any other request
    // takes.
    .shutdown_timeout(2)
    .disable_signals();
    let server = match cfg.tls {
        Some(tls) => server.bind_rustls_0_23(cfg.addr, (*tls).clone()),
        None => server.bind(cfg.addr),
    }
    .with_context(|| format!("cannot listen on {} (http_listen)", cfg.addr))?;
    let addr = server.addrs().first().copied().unwrap_or(cfg.addr);
    let server = server.run();
    let handle = server.handle();
    let task = actix_rt::spawn(server);
    Ok(HttpServerHandle { addr, handle, task })
}

/// The largest request body `POST /wal` takes. A guess: larger than any single record
/// (16 MiB by default) with room for a batch, small enough that one request cannot exhaust
/// memory.
const MAX_BODY: usize = 64 << 20;

/// An error answer: every error of the admin API is a JSON object with an `error` text.
fn error(status: StatusCode, text: impl std::fmt::Display) -> HttpResponse {
    HttpResponse::build(status).json(serde_json::json!({ "error": text.to_string() }))
}

/// What the stand-alone API answers to a method and path it has no endpoint for: a 404 in
/// JSON like every other error, naming what was asked.
async fn no_such_endpoint(req: HttpRequest) -> HttpResponse {
    error(
        StatusCode::NOT_FOUND,
        format!("no endpoint {} {}", req.method(), req.path()),
    )
}

/// A request body of at most [`MAX_BODY`] bytes, or the error answer: 413 as soon as the
/// declared length is over (nothing is read), or once the bytes read pass it. Read here rather
/// than through actix-web's `Bytes` extractor, whose refusal is plain text: every error of this
/// API is JSON.
async fn read_body(req: &HttpRequest, payload: web::Payload) -> Result<Bytes, HttpResponse> {
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body over the limit of {MAX_BODY} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    match payload.to_bytes_limited(MAX_BODY).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(e)) => Err(error(
            StatusCode::BAD_REQUEST,
            format!("cannot read the request body: {e}"),
        )),
        Err(_) => Err(too_large()),
    }
}

/// The request's query string as `T`, or why it is not one. Every query struct denies
/// unknown fields, so a misspelt parameter is refused with its name instead of silently
/// taking the default.
fn query<T: serde::de::DeserializeOwned>(req: &HttpRequest) -> Result<T, String> {
    match web::Query::<T>::from_query(req.query_string()) {
        Ok(q) => Ok(q.into_inner()),
        Err(actix_web::error::QueryPayloadError::Deserialize(e)) => {
            Err(format!("invalid query string: {e}"))
        }
        Err(e) => Err(e.to_string()),
    }
}

/// The query of an endpoint that takes no parameters: any parameter is refused.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NoQuery {}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendQuery {
    durability: Option<String>,
}

async fn append(state: web::Data<State>, req: HttpRequest, payload: web::Payload) -> HttpResponse {
    let query: AppendQuery = match query(&req) {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let body = match read_body(&req, payload).await {
        Ok(b) => b,
        Err(answer) => return answer,
    };
    let durability = match query.durability.as_deref().map(str::parse::<Durability>) {
        None => None,
        Some(Ok(d)) => Some(d),
        Some(Err(e)) => return HttpResponse::BadRequest().json(serde_json::json!({ "error": e })),
    };
    let many = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with(RECORDS_CONTENT_TYPE));
    let records = if many {
        match split_records(body) {
            Ok(r) => r,
            Err(e) => return HttpResponse::BadRequest().json(serde_json::json!({ "error": e })),
        }
    } else {
        vec![body]
    };
    match state
        .node
        .supervisor
        .send(AppendRecords {
            records,
            durability,
        })
        .await
    {
        Ok(Ok(a)) => HttpResponse::Ok().json(serde_json::json!({
            "end_lsn": a.end_lsn,
            "records": a.record_ends.len(),
            "timeline": a.timeline,
            "durability": a.durability,
        })),
        Ok(Err(e)) => {
            let status = match &e {
                AppendError::Standby | AppendError::RelayedPostgresWal => {
                    actix_web::http::StatusCode::CONFLICT
                }
                AppendError::Empty => actix_web::http::StatusCode::BAD_REQUEST,
                AppendError::Storage(wal_storage::WalError::RecordTooLarge { .. }) => {
                    actix_web::http::StatusCode::PAYLOAD_TOO_LARGE
                }
                AppendError::NotConfirmed { .. } | AppendError::Indeterminate { .. } => {
                    actix_web::http::StatusCode::GATEWAY_TIMEOUT
                }
                AppendError::ShuttingDown | AppendError::NotLeader { .. } => {
                    actix_web::http::StatusCode::SERVICE_UNAVAILABLE
                }
                // A full disk is backpressure: retry once space is freed.
                AppendError::Storage(w) if w.is_disk_full() => {
                    actix_web::http::StatusCode::INSUFFICIENT_STORAGE
                }
                // The archive is behind by more than archive_max_backlog: retry once it
                // catches up.
                AppendError::Storage(w) if w.is_archive_backlog() => {
                    actix_web::http::StatusCode::SERVICE_UNAVAILABLE
                }
                // Storage is being reopened after a failed sync: retry shortly.
                AppendError::Storage(w) if w.is_storage_failed() => {
                    actix_web::http::StatusCode::SERVICE_UNAVAILABLE
                }
                AppendError::Storage(_) => actix_web::http::StatusCode::INTERNAL_SERVER_ERROR,
            };
            let mut resp = HttpResponse::build(status);
            if matches!(
                status,
                actix_web::http::StatusCode::INSUFFICIENT_STORAGE
                    | actix_web::http::StatusCode::SERVICE_UNAVAILABLE
            ) {
                // Both clear by themselves (space freed, storage reopened, a shutdown over,
                // a leader elected and found by the client);
                // one second is about how long a full standby or a storage restart takes to
                // come back here, a guess that keeps a well-behaved client from spinning.
                resp.insert_header((actix_web::http::header::RETRY_AFTER, "1"));
            }
            if e.is_indeterminate() {
                // Durable here but not acknowledged: the client must not take it for lost.
                return resp.json(serde_json::json!({
                    "error": e.to_string(),
                    "outcome": "indeterminate",
                }));
            }
            resp.json(serde_json::json!({ "error": e.to_string() }))
        }
        Err(e) => unavailable(e),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadQuery {
    from: String,
    #[serde(default)]
    follow: bool,
    #[serde(default)]
    format: Option<String>,
}

/// `GET /wal?from=LSN|earliest[&follow=true][&format=ndjson|binary]`: the node's records from
/// `from` (a record boundary or a segment start; `earliest` is the oldest record kept),
/// streamed as they become durable with `follow`.
///
/// Every mistake in the request is answered before any record, as a JSON error: `400` for an
/// invalid LSN (`0/0`), one inside a record or one beyond the durable end; `410` for one whose
/// WAL was removed, naming the oldest LSN kept (`{"error", "oldest_lsn"}`); `409` on a node
/// that stores relayed PostgreSQL WAL. Once the `200` is sent, a failure can only cut the body.
/// NDJSON (the default) gives one object per record, `{"timeline", "start", "end", "data"}`
/// with the payload in base64, and `{"timeline_switch": {"from", "to", "at"}}` where the
/// stream moves to the next timeline; `binary` gives the payloads length-delimited, as
/// `POST /wal` takes them.
///
/// In `binary` a timeline switch adds nothing to the body. The format carries payloads alone
/// (no LSNs, no timelines), and the records before and after a switch are, in order, the one
/// history this node holds, so the body is exactly what `POST /wal` would need to append the
/// same records elsewhere; a marker would break that. Readers who need to see switches (or
/// positions, to resume) read NDJSON.
async fn read_wal(state: web::Data<State>, req: HttpRequest) -> HttpResponse {
    use base64::Engine as _;
    use futures_util::StreamExt;
    let query: ReadQuery = match query(&req) {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let from = match query.from.as_str() {
        "earliest" => RecordsFrom::Earliest,
        lsn => match lsn.parse::<Lsn>() {
            Ok(l) if l.is_valid() => RecordsFrom::Lsn(l),
            Ok(l) => return error(StatusCode::BAD_REQUEST, format!("invalid LSN {l}")),
            Err(e) => return error(StatusCode::BAD_REQUEST, e),
        },
    };
    let binary = match query.format.as_deref() {
        None | Some("ndjson") => false,
        Some("binary") => true,
        Some(other) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("unknown format {other:?}: ndjson or binary"),
            )
        }
    };
    // The start is checked before the stream starts, so each mistake is its own answer: a
    // reader started inside a record would find no valid record header there and end the
    // body with a corruption report that is not true.
    let from = match check_records_start(state.node.wal.clone(), from).await {
        Ok(RecordsStart::At(lsn)) => lsn,
        Ok(RecordsStart::Removed { oldest }) => {
            return HttpResponse::Gone().json(serde_json::json!({
                "error": format!(
                    "the WAL at {} has been removed; the oldest LSN kept is {oldest} \
                     (from=earliest starts there)",
                    query.from
                ),
                "oldest_lsn": oldest,
            }))
        }
        Ok(RecordsStart::NotABoundary { record, next }) => {
            let mut text = format!("{} is not a record boundary", query.from);
            if let Some(r) = record {
                let _ = write!(text, "; the record there starts at {r}");
            }
            if let Some(n) = next {
                let _ = write!(text, "; the next record starts at {n}");
            }
            return error(StatusCode::BAD_REQUEST, text);
        }
        Ok(RecordsStart::AheadOfFlush { flushed }) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "{} is ahead of the WAL flush position of this node, {flushed}",
                    query.from
                ),
            )
        }
        Err(e @ wal_storage::WalError::WrongFormat { .. }) => {
            return error(StatusCode::CONFLICT, e)
        }
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e),
    };
    let follow = if query.follow {
        supervisor_actor::Follow::Forever
    } else {
        supervisor_actor::Follow::UntilCurrentEnd
    };
    let stream =
        state
            .node
            .records(from, follow)
            .map(move |ev| -> Result<Bytes, actix_web::Error> {
                // As text: actix logs a failed body with `{:?}`, which would print the error's
                // Debug form.
                let ev =
                    ev.map_err(|e| actix_web::error::ErrorInternalServerError(e.to_string()))?;
                Ok(match ev {
                    supervisor_actor::RecordEvent::Record {
                        timeline,
                        start,
                        end,
                        payload,
                    } => {
                        if binary {
                            Bytes::from(join_records([payload.as_ref()]))
                        } else {
                            let mut line = serde_json::to_vec(&serde_json::json!({
                                "timeline": timeline,
                                "start": start,
                                "end": end,
                                "data": base64::engine::general_purpose::STANDARD.encode(&payload),
                            }))
                            .unwrap_or_default();
                            line.push(b'\n');
                            Bytes::from(line)
                        }
                    }
                    supervisor_actor::RecordEvent::TimelineSwitch { from, to, at } => {
                        if binary {
                            // An empty item, which the filter below drops.
                            Bytes::new()
                        } else {
                            let mut line = serde_json::to_vec(&serde_json::json!({
                                "timeline_switch": { "from": from, "to": to, "at": at }
                            }))
                            .unwrap_or_default();
                            line.push(b'\n');
                            Bytes::from(line)
                        }
                    }
                })
            });
    // No empty items: in chunked encoding an empty chunk ends the body, and only actix's
    // skipping of them keeps one from doing so.
    let stream =
        stream.filter(|item| std::future::ready(!item.as_ref().is_ok_and(Bytes::is_empty)));
    let content_type = if binary {
        RECORDS_CONTENT_TYPE
    } else {
        "application/x-ndjson"
    };
    HttpResponse::Ok()
        .content_type(content_type)
        .streaming(stream)
}

async fn promote(state: web::Data<State>, req: HttpRequest) -> HttpResponse {
    if let Err(e) = query::<NoQuery>(&req) {
        return error(StatusCode::BAD_REQUEST, e);
    }
    match state.node.supervisor.send(Promote).await {
        Ok(Ok(p)) => HttpResponse::Ok().json(p),
        Ok(Err(e)) => {
            let status = match e {
                PromoteError::NotStandby
                | PromoteError::InProgress
                | PromoteError::ManagedByFailover => actix_web::http::StatusCode::CONFLICT,
                PromoteError::Storage(wal_storage::WalError::PromotionNotSupported) => {
                    actix_web::http::StatusCode::CONFLICT
                }
                PromoteError::ShuttingDown => actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
                PromoteError::Storage(_) => actix_web::http::StatusCode::INTERNAL_SERVER_ERROR,
            };
            HttpResponse::build(status).json(serde_json::json!({ "error": e.to_string() }))
        }
        Err(e) => unavailable(e),
    }
}

async fn reload(state: web::Data<State>, req: HttpRequest) -> HttpResponse {
    if let Err(e) = query::<NoQuery>(&req) {
        return error(StatusCode::BAD_REQUEST, e);
    }
    let Some(reload) = state.reload.clone() else {
        return HttpResponse::NotImplemented().json(
            serde_json::json!({ "error": "this node was not started from a configuration file" }),
        );
    };
    match reload().await {
        // Settings that wait for a restart are named in the answer as well as in the log.
        Ok(pending) => HttpResponse::Ok().json(serde_json::json!({
            "reloaded": true,
            "pending_restart": pending.0,
            "warnings": pending.messages(),
        })),
        Err(e) => HttpResponse::BadRequest().json(serde_json::json!({ "error": format!("{e:#}") })),
    }
}

async fn check_token(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let expected = req
        .app_data::<web::Data<State>>()
        .and_then(|s| s.token.clone());
    if let Some(token) = expected {
        let given = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let ok = given.is_some_and(|g| token_matches(g, &token));
        if !ok {
            return Err(actix_web::error::ErrorUnauthorized(
                "missing or wrong bearer token",
            ));
        }
    }
    next.call(req).await
}

/// Whether the bearer token given is the one expected, compared in constant time for tokens
/// of the expected length (a different length is refused at once; the length is no secret).
fn token_matches(given: &str, expected: &str) -> bool {
    given.as_bytes().ct_eq(expected.as_bytes()).into()
}

fn unavailable(e: impl std::fmt::Display) -> HttpResponse {
    HttpResponse::ServiceUnavailable().json(serde_json::json!({ "error": e.to_string() }))
}

async fn status(state: web::Data<State>, req: HttpRequest) -> HttpResponse {
    if let Err(e) = query::<NoQuery>(&req) {
        return error(StatusCode::BAD_REQUEST, e);
    }
    match state.node.supervisor.send(GetNodeStatus).await {
        Ok(Ok(mut s)) => {
            if let Some(slot) = &state.failover {
                s.failover = Some(crate::failover::membership_status(slot).await);
            }
            let Some(archiver) = &state.archiver else {
                return HttpResponse::Ok().json(s);
            };
            // `archiver` beside the supervisor's fields: pg_stat_archiver's columns and the
            // archived position. Both serialize to JSON objects, so the insert cannot miss.
            let mut body = serde_json::to_value(&s).unwrap_or_default();
            let archiver = archiver.borrow().clone();
            if let (Some(obj), Ok(mut a)) = (body.as_object_mut(), serde_json::to_value(&archiver))
            {
                // The backlog's age at this moment, beside the time it counts from.
                if let Some(a) = a.as_object_mut() {
                    let seconds = archiver.backlog_seconds(std::time::SystemTime::now());
                    a.insert("backlog_seconds".into(), seconds.into());
                }
                obj.insert("archiver".into(), a);
            }
            HttpResponse::Ok().json(body)
        }
        Ok(Err(e)) => unavailable(e),
        Err(e) => unavailable(e),
    }
}

/// A row of `pg_replication_slots`, for physical slots.
#[derive(Serialize)]
struct SlotRow {
    slot_name: String,
    plugin: Option<String>,
    slot_type: &'static str,
    temporary: bool,
    active: bool,
    /// The process id of the walsender streaming from the slot (its BackendKeyData's).
    active_pid: Option<u32>,
    restart_lsn: Option<Lsn>,
    restart_tli: Option<TimelineId>,
    wal_status: Option<&'static str>,
    safe_wal_size: Option<i64>,
}

impl From<SlotInfo> for SlotRow {
    fn from(s: SlotInfo) -> SlotRow {
        SlotRow {
            slot_name: s.name,
            plugin: None,
            slot_type: "physical",
            temporary: s.temporary,
            active: s.active,
            active_pid: s.active_pid,
            restart_lsn: s.restart_lsn,
            restart_tli: s.restart_tli,
            wal_status: s.wal_status.map(|w| w.as_str()),
            safe_wal_size: s.safe_wal_size,
        }
    }
}

async fn slots(state: web::Data<State>, req: HttpRequest) -> HttpResponse {
    if let Err(e) = query::<NoQuery>(&req) {
        return error(StatusCode::BAD_REQUEST, e);
    }
    let rows: Vec<SlotRow> = state
        .node
        .wal
        .slots()
        .into_iter()
        .map(SlotRow::from)
        .collect();
    HttpResponse::Ok().json(rows)
}

/// `GET /metrics`: the text is written by [`crate::metrics`].
async fn metrics(state: web::Data<State>, req: HttpRequest) -> HttpResponse {
    if let Err(e) = query::<NoQuery>(&req) {
        return error(StatusCode::BAD_REQUEST, e);
    }
    let failover = state.failover.as_ref().and_then(FailoverSlot::get);
    let archiver = state.archiver.as_ref().map(|a| a.borrow().clone());
    match crate::metrics::render(&state.node, failover, archiver).await {
        Ok(text) => HttpResponse::Ok()
            .content_type(crate::metrics::CONTENT_TYPE)
            .body(text),
        Err(e) => unavailable(format!("{e:#}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_only_when_equal() {
        assert!(token_matches("s3cret", "s3cret"));
        assert!(!token_matches("s3creT", "s3cret"));
        // Different lengths, including a prefix and the empty token, never match.
        assert!(!token_matches("s3cre", "s3cret"));
        assert!(!token_matches("s3crets", "s3cret"));
        assert!(!token_matches("", "s3cret"));
    }
}
