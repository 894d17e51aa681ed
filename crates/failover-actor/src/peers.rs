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
