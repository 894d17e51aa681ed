//! Automatic failover in the binary: the failover actor started beside a node whose settings
//! have a `[failover]` table, and the admin API's endpoints for it and for load balancers:
//! `GET /cluster`, `GET /history`, `GET /primary`, `GET /replica?lag=SIZE`, `POST /switchover`,
//! `POST /failover`, `POST /pause`, `POST /resume`, `POST /cluster/slots/add` and
//! `POST /cluster/slots/remove` (the permanent slots, `{"name": NAME}`).
//!
//! The node is started with a closed fence (`walserver_node::node::node_config` does that for a
//! `[failover]` table), so it acknowledges nothing until the actor holds the leader key. The
//! actor needs the addresses the node's listeners were actually bound to (a port 0 in the
//! settings is only known then), and the admin API needs the actor, so the admin API is bound
//! first with an empty [`FailoverSlot`], which [`start`] fills.
//!
//! `/primary` and `/replica` answer from this node's own state, without a trip to etcd, so a
//! load balancer's health checks stay cheap and keep answering while etcd is away: with
//! failover `/primary` is 200 only while this node holds the leader key and its own deadline
//! has not passed; without it, on any primary. A node under failover that is not a member of
//! its cluster now (it has not joined, cannot reach etcd, let its lease run out or lost its
//! name) answers 503 to both, with the reason: it is neither the cluster's primary nor one
//! of its standbys, whatever its own role.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use actix::Addr;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use anyhow::Context;
use bytes::Bytes;
use failover_actor::{
    AddPermanentSlot, Failover, FailoverActor, FailoverError, GetClusterView, GetFailoverStatus,
    GetHistory, GetLocalHealth, LocalHealth, Pause, RemovePermanentSlot, Resume, StopFailover,
    Switchover,
};
use supervisor_actor::{
    FailoverStatus, GetNodeStatus, MembershipState, Node, NodeRole, SuperviseService,
};
use walreceiver_actor::ReceiverState;
use walserver_node::config::Settings;

/// Where the admin API finds the failover actor once it runs. `None` in the admin API's
/// state means failover is not configured; an empty slot, that it is still starting.
#[derive(Clone, Default)]
pub struct FailoverSlot(Arc<OnceLock<Addr<FailoverActor>>>);

impl FailoverSlot {
    pub fn get(&self) -> Option<Addr<FailoverActor>> {
        self.0.get().cloned()
    }
}

/// Asks etcd once whether it takes the `[failover]` table's TLS files and password, before
/// the node starts: a refusal (a wrong password, an unknown CA, a certificate for another
/// name, a client certificate etcd does not take or needs) is a setting to fix, which the
/// failover actor's retries would never mend, so it stops the node with etcd's reason. etcd
/// being away is no such thing: the node starts, and the actor keeps trying.
pub async fn check_etcd_access(settings: &Settings) -> anyhow::Result<()> {
    let Some(f) = &settings.failover else {
        return Ok(());
    };
    let client = f.etcd_client()?;
    match client.check_access().await {
        Ok(()) => Ok(()),
        Err(e) if e.is_refused_credentials() => Err(anyhow::Error::new(e).context(format!(
            "etcd ({}) refuses this node's failover settings (etcd_cacert, etcd_cert, etcd_key, etcd_username, etcd_password)",
            f.etcd_endpoints.join(",")
        ))),
        Err(e) => {
            tracing::warn!(error = %e, "etcd does not answer yet; automatic failover keeps trying");
            Ok(())
        }
    }
}

/// Refuses to start a node whose `node_name` another live process holds: its member key in
/// etcd, which the candidates read, would be taken for this one's. A key left by a process
/// that died a moment ago is waited out (at most its lease's remaining time). etcd being away
/// is left to the failover actor, which keeps trying and never writes over a held key.
pub async fn check_member_name(settings: &Settings) -> anyhow::Result<()> {
    let Some(f) = &settings.failover else {
        return Ok(());
    };
    let client = f.etcd_client()?;
    match failover_actor::check_member_name(&client, &f.cluster_name, &f.node_name).await {
        Ok(()) => Ok(()),
        Err(e @ FailoverError::NameHeld { .. }) => Err(anyhow::Error::new(e).context(format!(
            "cannot start: cluster \"{}\" already has a member named \"{}\"",
            f.cluster_name, f.node_name
        ))),
        Err(e) => {
            tracing::warn!(error = %e, "cannot check in etcd that this node's name is free; automatic failover keeps trying");
            Ok(())
        }
    }
}

/// Starts the failover actor the settings' `[failover]` table describes for `node`, whose
/// listeners are bound (`http` is the admin API's address), puts it in `slot` and hands it to
/// the node's supervisor, which lists it among the node's services. `None` without a table.
pub fn start(
    settings: &Settings,
    node: &Node,
    http: SocketAddr,
    slot: &FailoverSlot,
) -> anyhow::Result<Option<Addr<FailoverActor>>> {
    let Some(f) = &settings.failover else {
        return Ok(None);
    };
    let tls = settings.ssl_cert_file.is_some();
    let mut config = f.failover_config(node.listen_addr, http, tls);
    config.archive = walserver_node::archive::gap_archive(settings)?;
    // The walreceiver it starts for each leader runs on this node's own settings, as a
    // standby's would.
    config.receiver_session.wal_receiver_timeout = settings.wal_receiver_timeout;
    config.receiver_session.wal_receiver_status_interval = settings.wal_receiver_status_interval;
    config.receiver_session.commit_overlap = settings.synchronous_commit_overlap;
    tracing::info!(
        cluster = %config.cluster_name,
        node = %config.node_name,
        etcd = %config.etcd_endpoints.join(","),
        "starting automatic failover"
    );
    let addr = FailoverActor::start(config, node.clone()).with_context(|| {
        format!(
            "cannot start automatic failover (cluster {}, etcd {})",
            f.cluster_name,
            f.etcd_endpoints.join(",")
        )
    })?;
    let _ = slot.0.set(addr.clone());
    // The supervisor stops it in the node's shutdown order, after the walsenders have
    // drained: its fence closes and its lease is revoked, so that a successor need not wait
    // out the ttl. The actor tells nobody when it ends by itself, so its end is its stop.
    let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
    let actor = addr.clone();
    node.supervisor.do_send(SuperviseService {
        name: "failover".into(),
        ended: Box::pin(async move {
            let _ = stopped_rx.await;
            Ok(())
        }),
        stop: Box::new(move || {
            Box::pin(async move {
                let _ = actor.send(StopFailover { release: true }).await;
                let _ = stopped_tx.send(());
            })
        }),
    });
    Ok(Some(addr))
}

/// The state of the failover endpoints.
pub(crate) struct FailoverState {
    pub(crate) node: Node,
    /// `None` when the node has no `[failover]` table.
    pub(crate) failover: Option<FailoverSlot>,
}

/// The failover endpoints, for the stand-alone admin API.
pub(crate) fn routes(cfg: &mut web::ServiceConfig, state: web::Data<FailoverState>) {
    cfg.app_data(state)
        .route("/cluster", web::get().to(cluster))
        .route("/history", web::get().to(history))
        .route("/primary", web::get().to(primary))
        .route("/replica", web::get().to(replica))
        .route("/switchover", web::post().to(switchover))
        .route("/failover", web::post().to(failover))
        .route("/pause", web::post().to(pause))
        .route("/resume", web::post().to(resume))
        .route("/cluster/slots/add", web::post().to(add_slot))
        .route("/cluster/slots/remove", web::post().to(remove_slot));
}

fn error(status: StatusCode, text: impl std::fmt::Display) -> HttpResponse {
    HttpResponse::build(status).json(serde_json::json!({ "error": text.to_string() }))
}

/// An error answer not yet built: a status and its text (small, unlike a response).
struct Refusal(StatusCode, String);

impl Refusal {
    fn new(status: StatusCode, text: impl std::fmt::Display) -> Refusal {
        Refusal(status, text.to_string())
    }
}

impl From<Refusal> for HttpResponse {
    fn from(r: Refusal) -> HttpResponse {
        error(r.0, r.1)
    }
}

const NOT_CONFIGURED: &str =
    "automatic failover is not configured on this node (its configuration has no [failover] table)";

/// The failover actor, or the answer that says why there is none.
fn actor(state: &FailoverState) -> Result<Addr<FailoverActor>, Refusal> {
    match &state.failover {
        None => Err(Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            NOT_CONFIGURED,
        )),
        Some(slot) => slot.get().ok_or_else(|| {
            Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "automatic failover is starting; try again",
            )
        }),
    }
}

/// The answer's text for a node that is not a member of its cluster now.
fn not_a_member(reason: &str) -> String {
    format!("this node is not a member of its failover cluster: {reason}")
}

/// `/status`'s `failover` for a node whose settings have a `[failover]` table: the actor's
/// answer, or, while it starts or once it is gone, a node that is not a member.
pub(crate) async fn membership_status(slot: &FailoverSlot) -> FailoverStatus {
    let not_joined = |reason: String| FailoverStatus {
        state: MembershipState::NotJoined,
        reason: Some(reason),
        since: None,
        leader: None,
        term: None,
        paused: false,
    };
    match slot.get() {
        None => not_joined("automatic failover is starting".into()),
        Some(a) => match a.send(GetFailoverStatus).await {
            Ok(s) => s,
            Err(e) => not_joined(format!("the failover actor is gone: {e}")),
        },
    }
}

/// The status a failover error is answered with.
fn failover_status(e: &FailoverError) -> StatusCode {
    match e {
        FailoverError::Etcd(_) | FailoverError::NoLeader | FailoverError::NotRunning => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        FailoverError::NoSuchMember(_) => StatusCode::NOT_FOUND,
        FailoverError::NotEligible(..)
        | FailoverError::Paused
        | FailoverError::Refused(_)
        | FailoverError::NameHeld { .. } => StatusCode::CONFLICT,
        FailoverError::BadSlotName(_) => StatusCode::BAD_REQUEST,
    }
}

/// An actor's answer as JSON, or its error with its status.
fn answer<T: serde::Serialize>(
    r: Result<Result<T, FailoverError>, actix::MailboxError>,
) -> HttpResponse {
    match r {
        Ok(Ok(v)) => HttpResponse::Ok().json(v),
        Ok(Err(e)) => error(failover_status(&e), e),
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the failover actor is gone: {e}"),
        ),
    }
}

fn no_query(req: &HttpRequest) -> Result<(), Refusal> {
    if req.query_string().is_empty() {
        Ok(())
    } else {
        Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!(
                "{} takes no query parameters (given {:?})",
                req.path(),
                req.query_string()
            ),
        ))
    }
}

/// `GET /cluster`: the cluster as this node's failover actor sees it in etcd.
async fn cluster(state: web::Data<FailoverState>, req: HttpRequest) -> HttpResponse {
    if let Err(r) = no_query(&req) {
        return r.into();
    }
    match actor(&state) {
        Ok(a) => answer(a.send(GetClusterView).await),
        Err(r) => r.into(),
    }
}

/// `GET /history`: the cluster's terms, oldest first.
async fn history(state: web::Data<FailoverState>, req: HttpRequest) -> HttpResponse {
    if let Err(r) = no_query(&req) {
        return r.into();
    }
    match actor(&state) {
        Ok(a) => answer(a.send(GetHistory).await),
        Err(r) => r.into(),
    }
}

/// `GET /primary`: 200 on the node that may acknowledge appends as the primary.
async fn primary(state: web::Data<FailoverState>, req: HttpRequest) -> HttpResponse {
    if let Err(r) = no_query(&req) {
        return r.into();
    }
    if state.failover.is_some() {
        let a = match actor(&state) {
            Ok(a) => a,
            Err(r) => return r.into(),
        };
        return match a.send(GetLocalHealth).await {
            Ok(LocalHealth {
                not_member: Some(reason),
                term,
                ..
            }) => HttpResponse::ServiceUnavailable().json(serde_json::json!({
                "error": not_a_member(&reason),
                "primary": false,
                "term": term,
            })),
            Ok(h) if h.leader_with_live_lease => HttpResponse::Ok().json(serde_json::json!({
                "primary": true,
                "term": h.term,
            })),
            Ok(h) => HttpResponse::ServiceUnavailable().json(serde_json::json!({
                "error": "this node does not hold the leader key with a live lease",
                "primary": false,
                "term": h.term,
            })),
            Err(e) => error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the failover actor is gone: {e}"),
            ),
        };
    }
    match state.node.supervisor.send(GetNodeStatus).await {
        Ok(Ok(s)) if s.role == NodeRole::Primary => HttpResponse::Ok().json(serde_json::json!({
            "primary": true,
            "timeline": s.timeline,
        })),
        Ok(Ok(_)) => HttpResponse::ServiceUnavailable().json(serde_json::json!({
            "error": "this node is a standby",
            "primary": false,
        })),
        Ok(Err(e)) => error(StatusCode::SERVICE_UNAVAILABLE, e),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplicaQuery {
    /// The most a standby may be behind and still answer 200: `1MB`, `8kB` or bytes.
    lag: Option<String>,
}

/// Whether this node streams as a standby, and how far behind, from its own state: the
/// failover actor's, or without failover the walreceiver's (the upstream's last reported
/// end against the durable end here).
async fn standby_health(state: &FailoverState) -> Result<(bool, Option<u64>), Refusal> {
    if state.failover.is_some() {
        let a = actor(state)?;
        let h = a.send(GetLocalHealth).await.map_err(|e| {
            Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the failover actor is gone: {e}"),
            )
        })?;
        if let Some(reason) = h.not_member {
            return Err(Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                not_a_member(&reason),
            ));
        }
        return Ok((h.streaming && !h.leader_with_live_lease, h.lag_bytes));
    }
    let s = match state.node.supervisor.send(GetNodeStatus).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(Refusal::new(StatusCode::SERVICE_UNAVAILABLE, e)),
        Err(e) => return Err(Refusal::new(StatusCode::SERVICE_UNAVAILABLE, e)),
    };
    let receiver = s
        .wal_receiver
        .as_ref()
        .and_then(|w| w.status.as_ref().filter(|_| w.pid.is_some()));
    let streaming = s.role == NodeRole::Standby
        && receiver.is_some_and(|r| r.status == ReceiverState::Streaming);
    let lag = receiver
        .and_then(|r| r.latest_end_lsn)
        .map(|end| end.0.saturating_sub(s.flush_lsn.0));
    Ok((streaming, lag))
}

/// `GET /replica[?lag=SIZE]`: 200 on a streaming standby (within `lag` when given).
async fn replica(state: web::Data<FailoverState>, req: HttpRequest) -> HttpResponse {
    let q: ReplicaQuery = match web::Query::<ReplicaQuery>::from_query(req.query_string()) {
        Ok(q) => q.into_inner(),
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("invalid query string: {e}"),
            )
        }
    };
    let max_lag = match q
        .lag
        .as_deref()
        .map(|l| walserver_node::units::parse_size(l, 1))
    {
        None => None,
        Some(Ok(Some(bytes))) => Some(bytes),
        Some(Ok(None)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "lag=-1 is not a lag: give a size such as 1MB, 8kB or a number of bytes",
            )
        }
        Some(Err(e)) => return error(StatusCode::BAD_REQUEST, format!("lag: {e}")),
    };
    let (streaming, lag) = match standby_health(&state).await {
        Ok(h) => h,
        Err(r) => return r.into(),
    };
    let mut v = serde_json::json!({ "streaming": streaming, "lag_bytes": lag });
    match replica_verdict(streaming, lag, max_lag) {
        Ok(()) => HttpResponse::Ok().json(v),
        Err(e) => {
            v["error"] = serde_json::Value::String(e);
            HttpResponse::ServiceUnavailable().json(v)
        }
    }
}

/// Whether a standby streaming (or not) `lag` bytes behind passes `GET /replica?lag=max_lag`;
/// why not, if it does not. A lag not known yet fails a check that names one.
fn replica_verdict(streaming: bool, lag: Option<u64>, max_lag: Option<u64>) -> Result<(), String> {
    if !streaming {
        return Err("this node is not a streaming standby".into());
    }
    match (max_lag, lag) {
        (None, _) => Ok(()),
        (Some(max), Some(l)) if l <= max => Ok(()),
        (Some(max), Some(l)) => Err(format!(
            "this standby is {l} bytes behind, more than lag={max}"
        )),
        (Some(_), None) => Err("this standby's lag is not known yet".into()),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SwitchoverBody {
    #[serde(default)]
    candidate: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FailoverBody {
    candidate: String,
}

/// A JSON body as `T`; an empty body is `{}`.
fn body<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, Refusal> {
    let text: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    serde_json::from_slice(text)
        .map_err(|e| Refusal::new(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

/// `POST /switchover` `{"candidate": NAME?}`: a planned change of leader with no loss.
async fn switchover(state: web::Data<FailoverState>, req: HttpRequest, raw: Bytes) -> HttpResponse {
    if let Err(r) = no_query(&req) {
        return r.into();
    }
    let b: SwitchoverBody = match body(&raw) {
        Ok(b) => b,
        Err(r) => return r.into(),
    };
    match actor(&state) {
        Ok(a) => answer(
            a.send(Switchover {
                candidate: b.candidate,
            })
            .await,
        ),
        Err(r) => r.into(),
    }
}

/// `POST /failover` `{"candidate": NAME}`: a forced change of leader.
async fn failover(state: web::Data<FailoverState>, req: HttpRequest, raw: Bytes) -> HttpResponse {
    if let Err(r) = no_query(&req) {
        return r.into();
    }
    let b: FailoverBody = match body(&raw) {
        Ok(b) => b,
        Err(r) => return r.into(),
    };
    match actor(&state) {
        Ok(a) => answer(
            a.send(Failover {
                candidate: b.candidate,
            })
            .await,
        ),
        Err(r) => r.into(),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SlotBody {
    name: String,
}

/// `POST /cluster/slots/add` `{"name": NAME}`: NAME is a permanent slot from now on; the
/// answer says whether it already was.
async fn add_slot(state: web::Data<FailoverState>, req: HttpRequest, raw: Bytes) -> HttpResponse {
    change_slot(state, req, raw, true).await
}

/// `POST /cluster/slots/remove` `{"name": NAME}`: NAME is no longer a permanent slot, and
/// the members drop their slots of that name; the answer says whether it was one.
async fn remove_slot(
    state: web::Data<FailoverState>,
    req: HttpRequest,
    raw: Bytes,
) -> HttpResponse {
    change_slot(state, req, raw, false).await
}

async fn change_slot(
    state: web::Data<FailoverState>,
    req: HttpRequest,
    raw: Bytes,
    add: bool,
) -> HttpResponse {
    if let Err(r) = no_query(&req) {
        return r.into();
    }
    let SlotBody { name } = match body(&raw) {
        Ok(b) => b,
        Err(r) => return r.into(),
    };
    let a = match actor(&state) {
        Ok(a) => a,
        Err(r) => return r.into(),
    };
    let changed = if add {
        a.send(AddPermanentSlot { name: name.clone() }).await
    } else {
        a.send(RemovePermanentSlot { name: name.clone() }).await
    };
    let key = if add { "added" } else { "removed" };
    answer(changed.map(|r| {
        r.map(|changed| serde_json::json!({ "slot": name, "permanent": add, key: changed }))
    }))
}

/// `POST /pause`: automatic action off cluster-wide.
async fn pause(state: web::Data<FailoverState>, req: HttpRequest) -> HttpResponse {
    if let Err(r) = no_query(&req) {
        return r.into();
    }
    match actor(&state) {
        Ok(a) => answer(
            a.send(Pause)
                .await
                .map(|r| r.map(|()| serde_json::json!({ "paused": true }))),
        ),
        Err(r) => r.into(),
    }
}

/// `POST /resume`: automatic action on again.
async fn resume(state: web::Data<FailoverState>, req: HttpRequest) -> HttpResponse {
    if let Err(r) = no_query(&req) {
        return r.into();
    }
    match actor(&state) {
        Ok(a) => answer(
            a.send(Resume)
                .await
                .map(|r| r.map(|()| serde_json::json!({ "paused": false }))),
        ),
        Err(r) => r.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_passes_only_streaming_and_within_the_lag() {
        assert_eq!(replica_verdict(true, None, None), Ok(()));
        assert_eq!(replica_verdict(true, Some(5), None), Ok(()));
        assert_eq!(replica_verdict(true, Some(5), Some(5)), Ok(()));
        let e = replica_verdict(true, Some(6), Some(5)).unwrap_err();
        assert_eq!(e, "this standby is 6 bytes behind, more than lag=5");
        assert!(replica_verdict(true, None, Some(5)).is_err());
        assert!(replica_verdict(false, Some(0), Some(5)).is_err());
        assert!(replica_verdict(false, None, None).is_err());
    }

    #[test]
    fn failover_errors_have_real_statuses() {
        assert_eq!(
            failover_status(&FailoverError::NoSuchMember("x".into())),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            failover_status(&FailoverError::Paused),
            StatusCode::CONFLICT
        );
        assert_eq!(
            failover_status(&FailoverError::NoLeader),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
