//! The failover actor's etcd operations as plain async functions of a [`Client`]: reading
//! the cluster, applying watch events to what is known, campaigning, confirming a lease's hold
//! on the leader key, and the leader's guarded writes. They run on the actor's arbiter.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;

use etcd_gateway::{
    Client, Compare, Event, EventKind, KeyRange, KeyValue, LeaseId, Op, OpResponse, Txn,
    TxnResponse, WatchRequest,
};
use tracing::warn;

use crate::error::FailoverError;
use crate::keys::{KeyKind, Keys, PermanentSlotRecord, SwitchoverRecord, SyncRecord};
use crate::machine::{Cluster, LeaderKey, LeaderPosition};
use crate::outage::Quoted;
use crate::view::{MemberInfo, TermRecord};

/// Reads every key of the cluster: what is known, and the revision to watch after.
pub async fn read_cluster(
    client: &Client,
    keys: &Keys,
    known: &Cluster,
) -> Result<(Cluster, i64, Vec<TermRecord>), FailoverError> {
    let answer = client.range(&KeyRange::prefix(keys.prefix())).await?;
    let mut cluster = Cluster {
        last_leader: known.last_leader.clone(),
        latest_term: known.latest_term,
        ..Cluster::default()
    };
    let mut history = Vec::new();
    for kv in &answer.kvs {
        if let KeyKind::History = keys.classify(&kv.key) {
            if let Some(record) = parse::<TermRecord>(kv) {
                history.push(record);
            }
        }
        apply_put(&mut cluster, keys, kv);
    }
    Ok((cluster, answer.header.revision, history))
}

/// Applies one watch event to what is known.
pub fn apply_event(cluster: &mut Cluster, keys: &Keys, event: &Event) {
    match event.kind {
        EventKind::Put => apply_put(cluster, keys, &event.kv),
        EventKind::Delete => match keys.classify(&event.kv.key) {
            KeyKind::Leader => cluster.leader = None,
            KeyKind::Member(name) => {
                cluster.members.remove(name);
            }
            KeyKind::Sync => cluster.sync = None,
            KeyKind::Pause => cluster.paused = false,
            KeyKind::Switchover => cluster.switchover = None,
            KeyKind::Slot(name) => {
                cluster.permanent_slots.remove(name);
            }
            KeyKind::History | KeyKind::Other => {}
        },
    }
}

fn apply_put(cluster: &mut Cluster, keys: &Keys, kv: &KeyValue) {
    match keys.classify(&kv.key) {
        KeyKind::Leader => match String::from_utf8(kv.value.clone()) {
            Ok(holder) => {
                cluster.leader = Some(LeaderKey {
                    holder,
                    term: u64::try_from(kv.create_revision).unwrap_or(0),
                    lease: kv.lease.0,
                });
                remember_leader(cluster);
            }
            Err(_) => warn!("the leader key's value is not UTF-8; ignored"),
        },
        KeyKind::Member(name) => {
            if let Some(info) = parse::<MemberInfo>(kv) {
                if info.name == name {
                    cluster.members.insert(name.to_string(), info);
                    remember_leader(cluster);
                } else {
                    warn!(key = name, inner = %info.name, "a member key names another member; ignored");
                }
            }
        }
        KeyKind::Sync => cluster.sync = parse::<SyncRecord>(kv),
        KeyKind::Pause => cluster.paused = true,
        KeyKind::Switchover => cluster.switchover = parse::<SwitchoverRecord>(kv),
        KeyKind::Slot(name) => {
            // A value that does not parse still names a permanent slot: it is made, and its
            // position written, by the next leader.
            let record = parse::<PermanentSlotRecord>(kv).unwrap_or_default();
            cluster
                .permanent_slots
                .insert(name.to_string(), record.restart_lsn);
        }
        KeyKind::History => {
            cluster.has_history = true;
            if let Some(record) = parse::<TermRecord>(kv) {
                cluster.latest_term = cluster.latest_term.max(record.term);
            }
        }
        KeyKind::Other => {}
    }
}

/// Keeps the leader's last published position: its member key goes with its lease, at the
/// same moment as the leader key, and the candidates still need to know how far it had got.
fn remember_leader(cluster: &mut Cluster) {
    let Some(leader) = &cluster.leader else {
        return;
    };
    if let Some(member) = cluster.members.get(&leader.holder) {
        if let Ok(flush) = member.flush_lsn.parse() {
            cluster.last_leader = Some(LeaderPosition {
                name: member.name.clone(),
                timeline: member.timeline,
                flush,
            });
        }
    }
}

fn parse<T: serde::de::DeserializeOwned>(kv: &KeyValue) -> Option<T> {
    match serde_json::from_slice(&kv.value) {
        Ok(value) => Some(value),
        Err(e) => {
            warn!(key = %String::from_utf8_lossy(&kv.key), error = %Quoted(&e), "a value under the cluster's prefix does not parse; ignored");
            None
        }
    }
}

fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    // These are plain structs of strings and numbers: serialising cannot fail.
    serde_json::to_vec(value).unwrap_or_default()
}

/// The leader key is ours: its value is our name and it is on our lease.
fn held(keys: &Keys, me: &str, lease: LeaseId) -> [Compare; 2] {
    [
        Compare::value_is(keys.leader(), me),
        Compare::lease_is(keys.leader(), lease),
    ]
}

/// Creates the leader key on `lease` if it is absent, and ends any switchover (it named us,
/// or we could not have campaigned). `Ok(Some(term))` if we won.
pub async fn campaign(
    client: &Client,
    keys: &Keys,
    me: &str,
    lease: LeaseId,
) -> Result<Option<u64>, FailoverError> {
    let txn = Txn::new().when([Compare::absent(keys.leader())]).and_then([
        Op::put(keys.leader(), me, Some(lease)),
        Op::Delete(KeyRange::key(keys.switchover())),
    ]);
    let answer = client.txn(&txn).await?;
    // The put ran at the transaction's revision: the key's create revision, the term.
    Ok(answer
        .succeeded
        .then(|| u64::try_from(answer.header.revision).unwrap_or(0)))
}

/// Confirms that the leader key is still ours (value and lease), refreshing our member key
/// in the same step. `Ok(false)`: it is not.
pub async fn confirm(
    client: &Client,
    keys: &Keys,
    me: &str,
    lease: LeaseId,
    member: &MemberInfo,
) -> Result<bool, FailoverError> {
    put_member_when(client, keys, lease, member, &held(keys, me, lease)).await
}

/// Writes our member key on our lease: created if absent, refreshed while it is on our
/// lease, never written over another process's key ([`FailoverError::NameHeld`]).
pub async fn put_member(
    client: &Client,
    keys: &Keys,
    lease: LeaseId,
    member: &MemberInfo,
) -> Result<(), FailoverError> {
    put_member_when(client, keys, lease, member, &[]).await?;
    Ok(())
}

/// Writes our member key if `guard` holds and the key is ours or absent. etcd compares a
/// missing key's lease as 0, which no granted lease is, so one transaction refreshes a key on
/// our lease and a second creates an absent one. `Ok(false)`: the guard did not hold.
async fn put_member_when(
    client: &Client,
    keys: &Keys,
    lease: LeaseId,
    member: &MemberInfo,
    guard: &[Compare],
) -> Result<bool, FailoverError> {
    let key = keys.member(&member.name);
    for ours in [
        Compare::lease_is(key.clone(), lease),
        Compare::absent(key.clone()),
    ] {
        let txn = Txn::new()
            .when(guard.iter().cloned().chain([ours]))
            .and_then([Op::put(key.clone(), json(member), Some(lease))])
            .or_else([Op::Range(KeyRange::key(key.clone()))]);
        let answer = client.txn(&txn).await?;
        if answer.succeeded {
            return Ok(true);
        }
        match ranged(&answer) {
            Some(kv) if kv.lease != lease => return Err(name_held(&member.name, kv)),
            // The key is ours, so the guard failed.
            Some(_) => return Ok(false),
            None => {}
        }
    }
    Ok(false)
}

/// The key a transaction's single range found.
fn ranged(answer: &TxnResponse) -> Option<&KeyValue> {
    answer.responses.iter().find_map(|r| match r {
        OpResponse::Range(range) => range.kvs.first(),
        _ => None,
    })
}

/// `name`'s member key `kv` is another process's: the refusal names where that process
/// says it is.
fn name_held(name: &str, kv: &KeyValue) -> FailoverError {
    let advertised = match serde_json::from_slice::<MemberInfo>(&kv.value) {
        Ok(info) => format!("admin API {}, conninfo \"{}\"", info.api_url, info.conninfo),
        Err(_) => "an unreadable member key".to_string(),
    };
    FailoverError::NameHeld {
        name: name.to_string(),
        lease: kv.lease,
        advertised,
    }
}

/// How long past the holder's lease's remaining time, as etcd answers it, a check of a member
/// name waits for its key to go. etcd answers that time in whole seconds rounded down (up to a
/// second short) and revokes expired leases from a loop that runs every 500 ms, then through
/// its log: a second for the rounding and one for the revocation, a guess with room. With one
/// second in all, a name whose process was killed a moment ago was refused as held when the
/// rounding took most of a second.
const EXPIRY_MARGIN: Duration = Duration::from_secs(2);

/// Before a node starts: is `name` free in `cluster`? A process killed a moment ago leaves
/// its member key until its lease runs out, so a key that goes within the lease's remaining
/// time is no holder; a key refreshed on its lease meanwhile (every member refreshes its key
/// at each renewal, every ttl/3) or still there after that time belongs to a live process:
/// [`FailoverError::NameHeld`], naming its advertised addresses.
pub async fn check_member_name(
    client: &Client,
    cluster: &str,
    name: &str,
) -> Result<(), FailoverError> {
    let key = Keys::new(cluster).member(name);
    let answer = client.range(&KeyRange::key(key.clone())).await?;
    let Some(kv) = answer.kvs.first() else {
        return Ok(());
    };
    let remaining = client.lease_time_to_live(kv.lease, false).await?.ttl;
    let wait = Duration::from_secs(u64::try_from(remaining).unwrap_or(0)) + EXPIRY_MARGIN;
    tracing::info!(
        name,
        wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        "failover: this member name's key is still in etcd, on a lease; waiting for it to expire (a process of this name stopped a moment ago) or to be refreshed (one still runs)"
    );
    let mut watch = client
        .watch(&WatchRequest::new(KeyRange::key(key)).from_revision(answer.header.revision + 1))
        .await?;
    let gone = async {
        while let Some(batch) = watch.next().await {
            for event in batch?.events {
                match event.kind {
                    EventKind::Delete => return Ok(true),
                    EventKind::Put if event.kv.lease == kv.lease => return Ok(false),
                    EventKind::Put => {}
                }
            }
        }
        Ok::<_, FailoverError>(false)
    };
    match tokio::time::timeout(wait, gone).await {
        Ok(Ok(true)) => Ok(()),
        Ok(Err(e)) => Err(e),
        Ok(Ok(false)) | Err(_) => Err(name_held(name, kv)),
    }
}

/// The leader writes `history/<term>` (no lease: history outlives its leaders) and `sync`
/// for its term, guarded by its key.
pub async fn leader_put(
    client: &Client,
    keys: &Keys,
    me: &str,
    lease: LeaseId,
    key: String,
    value: Vec<u8>,
) -> Result<bool, FailoverError> {
    let txn = Txn::new()
        .when(held(keys, me, lease))
        .and_then([Op::put(key, value, None)]);
    Ok(client.txn(&txn).await?.succeeded)
}

/// Names `name` a permanent slot, keeping its position if it already is one; whether it
/// was new.
pub async fn add_permanent_slot(
    client: &Client,
    keys: &Keys,
    name: &str,
) -> Result<bool, FailoverError> {
    let key = keys.permanent_slot(name);
    let txn = Txn::new()
        .when([Compare::absent(key.clone())])
        .and_then([Op::put(key, json(&PermanentSlotRecord::default()), None)]);
    Ok(client.txn(&txn).await?.succeeded)
}

/// `name` is no longer a permanent slot; whether it was one.
pub async fn remove_permanent_slot(
    client: &Client,
    keys: &Keys,
    name: &str,
) -> Result<bool, FailoverError> {
    let deleted = client
        .delete_range(&KeyRange::key(keys.permanent_slot(name)))
        .await?;
    Ok(deleted.deleted > 0)
}

/// The leader writes where its permanent slot `name` holds WAL from, guarded by its key and
/// by the slot still being permanent (an operator's removal is never undone by a leader's
/// late write); whether it was written.
pub async fn put_slot_position(
    client: &Client,
    keys: &Keys,
    me: &str,
    lease: LeaseId,
    name: &str,
    record: &PermanentSlotRecord,
) -> Result<bool, FailoverError> {
    let key = keys.permanent_slot(name);
    let [value, lease_is] = held(keys, me, lease);
    let present = Compare::new(
        key.clone(),
        etcd_gateway::CompareOp::Greater,
        etcd_gateway::CompareTarget::CreateRevision(0),
    );
    let txn = Txn::new()
        .when([value, lease_is, present])
        .and_then([Op::put(key, json(record), None)]);
    Ok(client.txn(&txn).await?.succeeded)
}

pub fn history_value(record: &TermRecord) -> Vec<u8> {
    json(record)
}

pub fn sync_value(record: &SyncRecord) -> Vec<u8> {
    json(record)
}

/// Gives up the leader key, if it is still ours. `Ok(false)`: it was not.
pub async fn resign(
    client: &Client,
    keys: &Keys,
    me: &str,
    lease: LeaseId,
) -> Result<bool, FailoverError> {
    let txn = Txn::new()
        .when(held(keys, me, lease))
        .and_then([Op::Delete(KeyRange::key(keys.leader()))]);
    Ok(client.txn(&txn).await?.succeeded)
}

/// Asks the leader `record.from` to hand over: `switchover` on the leader's own lease (so it
/// goes when the leader does, and cannot keep a dead candidate as the only one allowed),
/// written only while `from` holds the key on `leader_lease` and no other handover runs.
pub async fn request_switchover(
    client: &Client,
    keys: &Keys,
    record: &SwitchoverRecord,
    leader_lease: LeaseId,
) -> Result<bool, FailoverError> {
    let txn = Txn::new()
        .when([
            Compare::value_is(keys.leader(), record.from.as_str()),
            Compare::lease_is(keys.leader(), leader_lease),
            Compare::absent(keys.switchover()),
        ])
        .and_then([Op::put(keys.switchover(), json(record), Some(leader_lease))]);
    Ok(client.txn(&txn).await?.succeeded)
}

/// Ends a handover that did not happen (its candidate did not take the key in time).
pub async fn cancel_switchover(client: &Client, keys: &Keys) -> Result<(), FailoverError> {
    client
        .delete_range(&KeyRange::key(keys.switchover()))
        .await?;
    Ok(())
}

/// The history, oldest term first.
pub async fn read_history(client: &Client, keys: &Keys) -> Result<Vec<TermRecord>, FailoverError> {
    let answer = client.range(&KeyRange::prefix(keys.history())).await?;
    let mut records: Vec<TermRecord> = answer.kvs.iter().filter_map(parse).collect();
    records.sort_by_key(|r| r.term);
    Ok(records)
}

/// Seconds since the Unix epoch, for the history.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
