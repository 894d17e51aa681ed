//! The HTTP writers of `append`, which follow the leader of a cluster.
//!
//! A load may name several admin APIs (`--http a,b,c`). Each writer posts to one of them; when
//! an append is refused, the connection fails, or the outcome is unknown, the writer asks each
//! endpoint's `GET /primary` (`200` only on the leader with a live lease) and goes on with the
//! one that answers `200`. Where no endpoint has `/primary` (nodes without automatic
//! failover), or none answers `200`, it moves on to the next endpoint in turn, so that a
//! standby's `409` still leads it to the primary.
//!
//! Every append ends in one of three outcomes ([`Outcome`]): acknowledged (a `2xx` with its
//! position: logged in the acknowledgement log), refused (an answer that says nothing was
//! written, or a connection that was never made: not logged, as nothing happened), or
//! indeterminate (a `504`, an answer saying `"outcome":"indeterminate"`, a `500`, a timeout or
//! a connection cut after the request was sent: logged as indeterminate, never as
//! acknowledged, since it may or may not be durable).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use walserver_node::admin::base_url;
use walserver_node::records::{join_records, RECORDS_CONTENT_TYPE};

use crate::acklog::{self, AckEntry, AckLog, IndeterminateEntry};
use crate::load::{Budget, Stats};

/// How long connecting to an endpoint may take before the append counts as never sent: a
/// guess, far above a connect on a live network and short enough that a host cut off is
/// left quickly.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one `GET /primary` may take: a guess, as short as a live node's answer allows, so
/// that a paused node does not hold the search for the leader.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// What became of one append.
#[derive(Debug, PartialEq)]
pub(crate) enum Outcome {
    /// A success, with the answer's JSON.
    Acked(serde_json::Value),
    /// Nothing was written: the answer said so, or the request never reached the node.
    Refused(String),
    /// It may or may not be durable.
    Indeterminate(String),
}

/// The outcome of an answer that is not a success.
pub(crate) fn classify_answer(status: u16, body: &str) -> Outcome {
    let outcome = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["outcome"].as_str().map(str::to_string));
    let what = format!("HTTP {status}: {body}");
    match (status, outcome.as_deref()) {
        (_, Some("indeterminate")) => Outcome::Indeterminate(what),
        // 504: written here but not confirmed as the durability level asks (a synchronous
        // standby did not answer in time, or leadership ended while it waited). 500: a storage
        // error whose effect is unknown.
        (504 | 500, _) => Outcome::Indeterminate(what),
        _ => Outcome::Refused(what),
    }
}

/// The outcome of a request that got no answer.
pub(crate) fn classify_transport(e: &ureq::Error) -> Outcome {
    use std::io::ErrorKind;
    let what = e.to_string();
    let never_sent = match e {
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound | ureq::Error::BadUri(_) => true,
        ureq::Error::Timeout(t) => matches!(t, ureq::Timeout::Connect | ureq::Timeout::Resolve),
        ureq::Error::Io(io) => matches!(
            io.kind(),
            ErrorKind::ConnectionRefused
                | ErrorKind::HostUnreachable
                | ErrorKind::NetworkUnreachable
                | ErrorKind::AddrNotAvailable
        ),
        _ => false,
    };
    if never_sent {
        Outcome::Refused(what)
    } else {
        Outcome::Indeterminate(what)
    }
}

/// A writer's endpoints and the one it posts to.
pub(crate) struct Endpoints {
    list: Vec<String>,
    current: usize,
    /// Posts appends, with the load's request timeout.
    agent: ureq::Agent,
    /// Asks `/primary`, with [`PROBE_TIMEOUT`].
    probe: ureq::Agent,
    token: Option<String>,
}

impl Endpoints {
    pub(crate) fn new(list: Vec<String>, token: Option<&str>, timeout: Option<Duration>) -> Self {
        let agent = |global: Option<Duration>| -> ureq::Agent {
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(global)
                .timeout_connect(Some(CONNECT_TIMEOUT))
                .build()
                .into()
        };
        Endpoints {
            list,
            current: 0,
            agent: agent(timeout),
            probe: agent(Some(PROBE_TIMEOUT)),
            token: token.map(str::to_string),
        }
    }

    pub(crate) fn current(&self) -> &str {
        &self.list[self.current]
    }

    fn url(&self, index: usize, path: &str) -> String {
        format!("{}{path}", base_url(&self.list[index]))
    }

    fn bearer(&self) -> Option<String> {
        self.token.as_ref().map(|t| format!("Bearer {t}"))
    }

    /// One `POST path` of `body` to the current endpoint.
    pub(crate) fn post(&self, path: &str, body: &[u8]) -> Outcome {
        let mut req = self
            .agent
            .post(self.url(self.current, path))
            .header("Content-Type", RECORDS_CONTENT_TYPE);
        if let Some(b) = self.bearer() {
            req = req.header("Authorization", &b);
        }
        match req.send(body) {
            Ok(mut resp) => {
                let status = resp.status();
                // Read the answer whole (also so that the connection can be reused); a body
                // cut short leaves the outcome unknown.
                let text = match resp.body_mut().read_to_string() {
                    Ok(t) => t,
                    Err(e) => return Outcome::Indeterminate(format!("HTTP {status}: {e}")),
                };
                if status.is_success() {
                    Outcome::Acked(serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
                } else {
                    classify_answer(status.as_u16(), &text)
                }
            }
            Err(e) => classify_transport(&e),
        }
    }

    /// Whether endpoint `index` says it is the leader: `Some(true)` for a `200` from
    /// `/primary`, `Some(false)` for another answer, `None` when it has no `/primary` (a
    /// `404`: a node without automatic failover) or does not answer.
    fn is_leader(&self, index: usize) -> Option<bool> {
        let mut req = self.probe.get(self.url(index, "/primary"));
        if let Some(b) = self.bearer() {
            req = req.header("Authorization", &b);
        }
        match req.call() {
            Ok(resp) if resp.status().as_u16() == 200 => Some(true),
            Ok(resp) if resp.status().as_u16() == 404 => None,
            Ok(_) => Some(false),
            Err(_) => None,
        }
    }

    /// After a failed append: goes on with the endpoint that says it leads, else the next one
    /// in turn. Returns whether a leader answered.
    pub(crate) fn find_leader(&mut self) -> bool {
        let n = self.list.len();
        if n == 1 {
            return false;
        }
        // The others first: the current one has just failed.
        for step in 1..=n {
            let i = (self.current + step) % n;
            if self.is_leader(i) == Some(true) {
                self.current = i;
                return true;
            }
        }
        self.current = (self.current + 1) % n;
        false
    }
}

/// One HTTP writer: appends one after another until the budget is spent.
pub(crate) struct HttpWriter {
    pub writer: usize,
    pub endpoints: Endpoints,
    pub path: String,
    pub size: usize,
    pub batch: usize,
    /// The body of every append when there is no log (all records alike).
    pub same_body: Arc<Vec<u8>>,
    pub ack_log: Option<Arc<AckLog>>,
    pub keep_going: bool,
}

impl HttpWriter {
    pub(crate) fn run(mut self, stats: &Mutex<Stats>, budget: &Budget) {
        let bytes = self.size * self.batch;
        let mut pause = Duration::ZERO;
        let mut seq = 0u64;
        while budget.take(bytes as u64) {
            let logged = self.ack_log.is_some().then(|| {
                let records: Vec<Vec<u8>> = (0..self.batch)
                    .map(|i| acklog::payload(self.writer, seq, i, self.size))
                    .collect();
                let hashes: Vec<String> = records.iter().map(|r| acklog::sha256_hex(r)).collect();
                (join_records(records.iter().map(Vec::as_slice)), hashes)
            });
            let body = logged
                .as_ref()
                .map_or(self.same_body.as_slice(), |(b, _)| b);
            let t = Instant::now();
            let outcome = self.endpoints.post(&self.path, body);
            let lat = t.elapsed();
            let node = self.endpoints.current().to_string();
            let hashes = logged.map(|(_, h)| h);
            let result = match (outcome, &self.ack_log, hashes) {
                (Outcome::Acked(answer), Some(log), Some(hashes)) => {
                    log_ack(log, self.writer, seq, &answer, hashes, &node)
                }
                (Outcome::Acked(_), _, _) => Ok(()),
                (Outcome::Indeterminate(why), Some(log), Some(hashes)) => {
                    let entry = IndeterminateEntry {
                        writer: self.writer,
                        seq,
                        hashes,
                        mono_ms: acklog::mono_ms(),
                        node: node.clone(),
                        reason: why.clone(),
                    };
                    match log.record_indeterminate(&entry) {
                        Ok(()) => Err(format!("{node}: indeterminate: {why}")),
                        Err(e) => Err(format!("{e:#}")),
                    }
                }
                (Outcome::Indeterminate(why), _, _) => Err(format!("{node}: indeterminate: {why}")),
                (Outcome::Refused(why), _, _) => Err(format!("{node}: {why}")),
            };
            seq += 1;
            let failed = {
                let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
                match result {
                    Ok(()) => {
                        s.ok(lat, self.batch, bytes);
                        false
                    }
                    Err(e) => {
                        s.err(e);
                        if !self.keep_going {
                            budget.stop.store(true, Ordering::Relaxed);
                        }
                        true
                    }
                }
            };
            if failed && self.keep_going {
                // Another endpoint may lead now; if one says so, try it at once.
                if self.endpoints.find_leader() {
                    pause = Duration::ZERO;
                    continue;
                }
                // Back off while no node takes appends, so that a cluster in the middle of a
                // failover is not flooded; the pause is a client's retry delay, not a wait for
                // an event.
                pause = (pause * 2).clamp(Duration::from_millis(10), Duration::from_millis(200));
                std::thread::sleep(pause);
            } else {
                pause = Duration::ZERO;
            }
        }
    }
}

/// Writes an acknowledged append to the log. An answer without its timeline or end LSN is an
/// error: an acknowledgement that cannot be checked is not counted as one.
fn log_ack(
    log: &AckLog,
    writer: usize,
    seq: u64,
    answer: &serde_json::Value,
    hashes: Vec<String>,
    node: &str,
) -> Result<(), String> {
    let mono_ms = acklog::mono_ms();
    let end_lsn = answer["end_lsn"].as_str().and_then(|s| s.parse().ok());
    let timeline = answer["timeline"]
        .as_u64()
        .and_then(|t| u32::try_from(t).ok());
    let (Some(end_lsn), Some(timeline)) = (end_lsn, timeline) else {
        return Err(format!("an acknowledgement without its position: {answer}"));
    };
    log.record(&AckEntry {
        writer,
        seq,
        timeline,
        end_lsn,
        hashes,
        mono_ms: Some(mono_ms),
        node: Some(node.to_string()),
        term: answer["term"].as_u64(),
    })
    .map_err(|e| format!("{e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_refusals_unless_they_say_otherwise() {
        let r = |s, b| matches!(classify_answer(s, b), Outcome::Refused(_));
        let i = |s, b| matches!(classify_answer(s, b), Outcome::Indeterminate(_));
        assert!(r(409, r#"{"error":"standby"}"#));
        assert!(r(503, r#"{"error":"not the leader"}"#));
        assert!(r(507, "full"));
        assert!(i(504, r#"{"error":"not confirmed"}"#));
        assert!(i(
            503,
            r#"{"error":"leadership lost","outcome":"indeterminate"}"#
        ));
        assert!(i(500, "storage"));
    }

    #[test]
    fn a_connection_never_made_is_a_refusal_and_a_cut_one_is_not() {
        use std::io::{Error, ErrorKind};
        let refused = ureq::Error::Io(Error::from(ErrorKind::ConnectionRefused));
        assert!(matches!(classify_transport(&refused), Outcome::Refused(_)));
        assert!(matches!(
            classify_transport(&ureq::Error::Timeout(ureq::Timeout::Connect)),
            Outcome::Refused(_)
        ));
        let reset = ureq::Error::Io(Error::from(ErrorKind::ConnectionReset));
        assert!(matches!(
            classify_transport(&reset),
            Outcome::Indeterminate(_)
        ));
        assert!(matches!(
            classify_transport(&ureq::Error::Timeout(ureq::Timeout::Global)),
            Outcome::Indeterminate(_)
        ));
    }

    /// A real exchange over loopback: a server that reads the request and closes without an
    /// answer leaves the append indeterminate; a port nobody listens on refuses it; and with
    /// two endpoints the writer moves on to the next one.
    #[test]
    fn outcomes_of_real_connections() {
        use std::io::Read;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let cut = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
        });
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        let mut e = Endpoints::new(
            vec![cut.clone(), closed.clone()],
            None,
            Some(Duration::from_secs(5)),
        );
        assert!(matches!(e.post("/wal", b"x"), Outcome::Indeterminate(_)));
        server.join().unwrap();
        assert!(!e.find_leader(), "no endpoint leads");
        assert_eq!(e.current(), closed);
        assert!(matches!(e.post("/wal", b"x"), Outcome::Refused(_)));
    }
}
