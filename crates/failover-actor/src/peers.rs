//! Asking the other members where they are before campaigning (as Patroni does): each
//! member's admin API answers `GET /status` with its `role`, `timeline` and `flush_lsn`. A
//! member that does not answer in time is judged by its member key instead (which is at most
//! a renewal interval old, so never ahead of the truth), and a member with neither is left out.

use std::time::Duration;

use futures_util::future::join_all;
use serde::Deserialize;
use wal_storage::Lsn;

use crate::machine::{LocalRole, PeerPosition};
use crate::view::MemberInfo;

/// How long one member's `/status` may take. A guess: an admin API answers in milliseconds;
/// a member that takes longer is probably not the one to promote, and the whole check must
/// stay well inside the ttl.
pub const PEER_TIMEOUT: Duration = Duration::from_millis(1000);

#[derive(Deserialize)]
struct StatusAnswer {
    role: String,
    timeline: u32,
    flush_lsn: String,
}

/// The positions of `members` (other than `me`).
pub async fn positions(me: &str, members: Vec<MemberInfo>) -> Vec<PeerPosition> {
    let asks = members
        .into_iter()
        .filter(|m| m.name != me)
        .map(|m| async move {
            let asked = if m.api_url.is_empty() {
                None
            } else {
                ask(&m.api_url).await
            };
            match asked {
                Some((role, timeline, flush)) => Some(position(&m, role, timeline, flush)),
                None => {
                    let flush: Lsn = m.flush_lsn.parse().ok()?;
                    Some(position(&m, role_of(&m.role), m.timeline, flush))
                }
            }
        });
    join_all(asks).await.into_iter().flatten().collect()
}

fn position(m: &MemberInfo, role: LocalRole, timeline: u32, flush: Lsn) -> PeerPosition {
    PeerPosition {
        name: m.name.clone(),
        role,
        timeline,
        flush,
        priority: m.priority,
        nofailover: m.nofailover,
    }
}

fn role_of(text: &str) -> LocalRole {
    if text == "primary" {
        LocalRole::Primary
    } else {
        LocalRole::Standby
    }
}

/// How long a leader's admin API may take to answer before `GET /cluster` shows it as
/// unreachable. A guess: an admin API on a live host answers in milliseconds, and the view
/// must not wait long for a dead one.
pub const REACHABLE_TIMEOUT: Duration = Duration::from_millis(500);

/// Whether the admin API at `api_url` answers `GET /primary` at all (any status), within
/// [`REACHABLE_TIMEOUT`].
pub async fn reachable(api_url: &str) -> bool {
    let url = format!("{}/primary", api_url.trim_end_matches('/'));
    let client = awc::Client::builder().timeout(REACHABLE_TIMEOUT).finish();
    client.get(url.as_str()).send().await.is_ok()
}

async fn ask(api_url: &str) -> Option<(LocalRole, u32, Lsn)> {
    let url = format!("{}/status", api_url.trim_end_matches('/'));
    let client = awc::Client::builder().timeout(PEER_TIMEOUT).finish();
    let mut answer = client.get(url.as_str()).send().await.ok()?;
    if !answer.status().is_success() {
        return None;
    }
    let status: StatusAnswer = answer.json().limit(1 << 20).await.ok()?;
    let flush = status.flush_lsn.parse().ok()?;
    Some((role_of(&status.role), status.timeline, flush))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn member(name: &str, api_url: String, flush: &str) -> MemberInfo {
        MemberInfo {
            name: name.into(),
            role: "standby".into(),
            timeline: 1,
            flush_lsn: flush.into(),
            lag_bytes: None,
            streaming: true,
            conninfo: String::new(),
            api_url,
            nofailover: false,
            priority: 3,
            term: None,
        }
    }

    /// Serves one HTTP answer with `body` on a loopback port.
    async fn one_answer(body: &'static str) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        actix_rt::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request ended early");
                request.extend_from_slice(&buf[..n]);
            }
            assert!(request.starts_with(b"GET /status "));
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            socket.write_all(answer.as_bytes()).await.unwrap();
        });
        url
    }

    #[actix_rt::test]
    async fn a_peer_is_judged_by_its_status_and_else_by_its_member_key() {
        let live =
            one_answer(r#"{"role":"primary","timeline":2,"flush_lsn":"0/5000","other":1}"#).await;
        let garbled = one_answer(r#"{"role":"standby"}"#).await;
        // A port that refuses: bound, then closed.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let members = vec![
            member("me", String::new(), "0/1"),
            member("live", live, "0/10"),
            member("garbled", garbled, "0/20"),
            member("gone", closed, "0/30"),
            member("no-key-position", String::new(), "not an lsn"),
        ];
        let mut got = positions("me", members).await;
        got.sort_by(|a, b| a.name.cmp(&b.name));
        let summary: Vec<_> = got
            .iter()
            .map(|p| (p.name.as_str(), p.role, p.timeline, p.flush))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("garbled", LocalRole::Standby, 1, Lsn(0x20)),
                ("gone", LocalRole::Standby, 1, Lsn(0x30)),
                ("live", LocalRole::Primary, 2, Lsn(0x5000)),
            ]
        );
        assert!(got.iter().all(|p| p.priority == 3));
    }
}
