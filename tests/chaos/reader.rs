//! A reader of a node's WAL from outside, as an application follows it: `GET /wal?follow=true`
//! kept open through every fault, reconnecting when the node goes away. It remembers every
//! record it was given, so that a scenario can check afterwards that nobody was given WAL that
//! did not last (the overlapped commit's rule 3: readers stop at the commit point, and the
//! commit point survives any power loss): every record a reader saw is on every node at the
//! end, on its timeline, at its LSN, with its bytes ([`Reader::assert_survived`]).

use std::collections::HashMap;
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wal_storage::Lsn;
use walserver_bench::acklog::{self, NodeRecord};

use crate::node::ChildNode;

/// How long the reader waits before it connects again to a node that is down or ended its
/// stream: a guess, short against a cycle's restart and long enough not to spin.
const RECONNECT: Duration = Duration::from_millis(20);

/// What a reader was given: each record by its timeline and start, and any place where it was
/// given two different records (itself a failure: WAL once served never changes).
#[derive(Default)]
struct Given {
    records: HashMap<(u32, Lsn), (Lsn, String)>,
    conflicts: Vec<String>,
}

/// A thread following one node's `GET /wal`.
pub struct Reader {
    name: String,
    given: Arc<Mutex<Given>>,
    stop: Arc<AtomicBool>,
}

impl Reader {
    /// Follows `node`'s records from the oldest it keeps until [`Reader::assert_survived`].
    /// The thread is not joined: it blocks on a stream that ends only when the node does, and
    /// leaves once it has been told to stop and its stream ends.
    pub fn follow(node: &ChildNode) -> Reader {
        let given = Arc::new(Mutex::new(Given::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let base = walserver_node::admin::base_url(&node.http);
        let (g, s) = (given.clone(), stop.clone());
        std::thread::Builder::new()
            .name(format!("reader of {}", node.name))
            .spawn(move || {
                let mut from = None;
                while !s.load(Ordering::Relaxed) {
                    // Where the last stream stopped, or the oldest record if that place is gone
                    // (a tail cut back) or nothing was read yet.
                    from = follow_once(&base, from, &g, &s);
                    std::thread::sleep(RECONNECT);
                }
            })
            .expect("spawn a reader");
        Reader {
            name: node.name.clone(),
            given,
            stop,
        }
    }

    /// Stops the reader and asserts that every record it was given is among `nodes`' records
    /// now (each node's `GET /wal?from=earliest`); returns how many it was given.
    pub fn assert_survived(self, nodes: &[&ChildNode]) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let given = self.given.lock().unwrap_or_else(|p| p.into_inner());
        assert!(
            given.conflicts.is_empty(),
            "the reader of {} was given different records at the same place: {:?}",
            self.name,
            given.conflicts
        );
        for node in nodes {
            let records = acklog::fetch_records(&node.http, None)
                .unwrap_or_else(|e| panic!("the records of {}: {e:#}", node.name));
            let held: HashMap<(u32, Lsn), (Lsn, &str)> = records
                .iter()
                .map(|r| ((r.timeline, r.start), (r.end, r.sha256.as_str())))
                .collect();
            let mut gone: Vec<String> = given
                .records
                .iter()
                .filter(|(k, (end, sha))| held.get(*k) != Some(&(*end, sha.as_str())))
                .map(|((tl, start), (end, _))| format!("timeline {tl} {start}..{end}"))
                .collect();
            gone.sort();
            assert!(
                gone.is_empty(),
                "the reader of {} was given {} records (of {}) that {} does not hold: nobody \
                 may read past the commit point; the first: {:?}",
                self.name,
                gone.len(),
                given.records.len(),
                node.name,
                &gone[..gone.len().min(10)]
            );
        }
        given.records.len()
    }
}

/// Reads one `GET /wal?follow=true` stream of the node at `base` from `from` (the oldest
/// record if `None`) until it ends or fails; returns where the next should start.
fn follow_once(
    base: &str,
    from: Option<Lsn>,
    given: &Mutex<Given>,
    stop: &AtomicBool,
) -> Option<Lsn> {
    let at = from.map_or("earliest".to_string(), |l| l.to_string());
    let url = format!("{base}/wal?from={at}&follow=true");
    let Ok(resp) = ureq::get(&url)
        .config()
        .http_status_as_error(false)
        .build()
        .call()
    else {
        return from;
    };
    if !resp.status().is_success() {
        // The place is gone (cut back, or on a timeline the node left): from the oldest.
        return None;
    }
    let mut next = from;
    let lines = std::io::BufReader::new(resp.into_body().into_reader()).lines();
    for line in lines {
        let Ok(line) = line else { break };
        if stop.load(Ordering::Relaxed) {
            break;
        }
        // A line that is not a record (a timeline switch) gives none.
        let Ok(records) = acklog::parse_records(&line) else {
            break;
        };
        let Ok(mut g) = given.lock() else { break };
        for NodeRecord {
            timeline,
            start,
            end,
            sha256,
        } in records
        {
            next = Some(end);
            match g.records.get(&(timeline, start)) {
                Some(known) if *known != (end, sha256.clone()) => {
                    let c = format!("timeline {timeline} at {start}: {known:?}, then {end}");
                    g.conflicts.push(c);
                }
                Some(_) => {}
                None => {
                    g.records.insert((timeline, start), (end, sha256));
                }
            }
        }
    }
    next
}
