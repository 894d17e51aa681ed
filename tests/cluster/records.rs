//! Reading a node's records as applications do: `Node::records` and `GET /wal` across a
//! promotion (the old timeline's records, a timeline switch, the new timeline's), `GET /wal`
//! following records appended after the request, and `format=binary` byte for byte; every
//! mistake in a `GET /wal` (an invalid LSN, removed WAL, a position inside a record, an unknown
//! parameter) answered with its status code and a JSON error before any record.

use std::io::{BufRead, Read};
use std::net::SocketAddr;
use std::sync::mpsc;

use base64::Engine as _;
use bytes::Bytes;
use futures_util::StreamExt;
use supervisor_actor::{Follow, RecordEvent};
use wal_storage::{Lsn, TimelineId};
use walserver_node::records::{join_records, RECORDS_CONTENT_TYPE};

use super::common::cluster::{http_get_any, http_post};
use super::common::*;
use super::{append_mib, KEEP, TL1, TL2};

/// Every event of `node`'s records from `from` to its current end.
pub(crate) fn read_records(node: &TestNode, from: Lsn) -> Vec<RecordEvent> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(
        node.node
            .records(from, Follow::UntilCurrentEnd)
            .collect::<Vec<_>>(),
    )
    .into_iter()
    .map(|ev| ev.expect("read records"))
    .collect()
}

/// `GET /wal` with `query`, answered 200: its content type and whole body.
fn get_wal(http: SocketAddr, query: &str) -> (String, Vec<u8>) {
    let (status, content_type, body) = get_wal_any(http, query);
    assert_eq!(
        status,
        200,
        "GET /wal?{query}: {}",
        String::from_utf8_lossy(&body)
    );
    (content_type, body)
}

/// The payloads `append_records(n, size, seed)` appends.
fn payloads(n: usize, size: usize, seed: u8) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| vec![seed.wrapping_add(i as u8); size])
        .collect()
}

/// A standby promoted after receiving records of timeline 1, then taking records of its own:
/// read from the start, its records are timeline 1's, one switch to timeline 2 at the
/// promotion's switch LSN, then timeline 2's, contiguous. `GET /wal` says the same in NDJSON,
/// and in `format=binary` gives the payloads alone, with nothing in place of the switch.
#[test]
fn records_read_across_a_promotion_switch_timelines() {
    let p = TestNode::primary(KEEP);
    let start = p.wal().flushed();
    let s = TestNode::standby_of(p.addr(), "s", KEEP);
    let before = p.append_records(10, 300, 1).expect("append on P");
    s.wait_flushed(TL1, before.end_lsn);
    let promoted = s.promote().expect("promote");
    assert_eq!(promoted.timeline, TL2);
    assert_eq!(promoted.switch_lsn, before.end_lsn);
    let after = s
        .append_records(5, 200, 100)
        .expect("append on the promoted standby");
    assert_eq!(after.timeline, TL2);
    let mut want: Vec<(TimelineId, Vec<u8>)> =
        payloads(10, 300, 1).into_iter().map(|p| (TL1, p)).collect();
    want.extend(payloads(5, 200, 100).into_iter().map(|p| (TL2, p)));

    // Node::records: the records in order, one switch between the timelines.
    let events = read_records(&s, start);
    let switch_at = events
        .iter()
        .position(|e| matches!(e, RecordEvent::TimelineSwitch { .. }))
        .expect("no TimelineSwitch event");
    assert_eq!(
        events[switch_at],
        RecordEvent::TimelineSwitch {
            from: TL1,
            to: TL2,
            at: promoted.switch_lsn
        }
    );
    assert_eq!(
        switch_at, 10,
        "the switch comes after timeline 1's ten records"
    );
    let mut got = Vec::new();
    // A segment starts with a header; the first record follows it.
    let mut next = None;
    for e in events
        .iter()
        .filter(|e| !matches!(e, RecordEvent::TimelineSwitch { .. }))
    {
        let RecordEvent::Record {
            timeline,
            start,
            end,
            payload,
        } = e
        else {
            unreachable!("switches were filtered out")
        };
        assert!(next.is_none_or(|n| n == *start), "records are contiguous");
        next = Some(*end);
        got.push((*timeline, payload.to_vec()));
    }
    assert_eq!(got, want);
    assert_eq!(next, Some(after.end_lsn));

    // GET /wal, NDJSON: the same, the switch as its own line.
    let (content_type, body) = get_wal(s.http_addr, &format!("from={start}"));
    assert_eq!(content_type, "application/x-ndjson");
    let lines: Vec<serde_json::Value> = body
        .lines()
        .map(|l| serde_json::from_str(&l.expect("a line")).expect("JSON"))
        .collect();
    assert_eq!(lines.len(), 16, "15 records and one switch");
    assert_eq!(
        lines[10],
        serde_json::json!({ "timeline_switch": {
            "from": 1, "to": 2, "at": promoted.switch_lsn.to_string()
        }})
    );
    let got: Vec<(TimelineId, Vec<u8>)> = lines
        .iter()
        .filter(|l| l.get("data").is_some())
        .map(|l| {
            let tli = TimelineId(l["timeline"].as_u64().unwrap() as u32);
            let data = base64::engine::general_purpose::STANDARD
                .decode(l["data"].as_str().unwrap())
                .unwrap();
            (tli, data)
        })
        .collect();
    assert_eq!(got, want);

    // GET /wal, binary: exactly the payloads, length-delimited, as POST /wal takes them.
    let (content_type, body) = get_wal(s.http_addr, &format!("from={start}&format=binary"));
    assert_eq!(content_type, RECORDS_CONTENT_TYPE);
    assert_eq!(body, join_records(want.iter().map(|(_, p)| p.as_slice())));
    // From the switch on, only the new timeline's records.
    let (_, body) = get_wal(
        s.http_addr,
        &format!("from={}&format=binary", promoted.switch_lsn),
    );
    assert_eq!(
        body,
        join_records(want[10..].iter().map(|(_, p)| p.as_slice()))
    );
}

/// `GET /wal?follow=true` delivers records appended after the request was answered, in
/// NDJSON and in binary; without `follow` the same request ends at once.
#[test]
fn get_wal_follow_delivers_records_appended_after_the_request() {
    let node = TestNode::primary("");
    node.append_records(3, 50, 7).expect("append");
    let from = node.wal().flushed();

    // Without follow: the stream ends where the WAL ends, with nothing after `from`.
    let (_, body) = get_wal(node.http_addr, &format!("from={from}"));
    assert!(body.is_empty(), "{}", String::from_utf8_lossy(&body));

    // The response's head has arrived, so the node has subscribed for the records: whatever
    // is appended from now on is after the request.
    let mut ndjson = ureq::get(&format!(
        "http://{}/wal?from={from}&follow=true",
        node.http_addr
    ))
    .call()
    .expect("GET /wal follow");
    let mut binary = ureq::get(&format!(
        "http://{}/wal?from={from}&follow=true&format=binary",
        node.http_addr
    ))
    .call()
    .expect("GET /wal follow binary");
    // Each body is read on its own thread, which hands over what it reads as it reads it.
    let (line_tx, lines) = mpsc::channel::<serde_json::Value>();
    std::thread::spawn(move || {
        let reader = std::io::BufReader::new(ndjson.body_mut().as_reader());
        for line in reader.lines() {
            let Ok(line) = line else { return };
            let Ok(v) = serde_json::from_str(&line) else {
                return;
            };
            if line_tx.send(v).is_err() {
                return;
            }
        }
    });
    let (rec_tx, records) = mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut reader = binary.body_mut().as_reader();
        loop {
            let mut len = [0u8; 4];
            if reader.read_exact(&mut len).is_err() {
                return;
            }
            let mut payload = vec![0u8; u32::from_be_bytes(len) as usize];
            if reader.read_exact(&mut payload).is_err() || rec_tx.send(payload).is_err() {
                return;
            }
        }
    });

    let mut at = from;
    for (round, (n, seed)) in [(2, 20u8), (4, 40u8)].into_iter().enumerate() {
        let appended = node.append_records(n, 64, seed).expect("append");
        for want in payloads(n, 64, seed) {
            let line = lines
                .recv_timeout(DEADLINE)
                .unwrap_or_else(|e| panic!("round {round}: no NDJSON record ({e})"));
            assert_eq!(line["start"], serde_json::json!(at.to_string()));
            at = line["end"].as_str().unwrap().parse().unwrap();
            let data = base64::engine::general_purpose::STANDARD
                .decode(line["data"].as_str().unwrap())
                .unwrap();
            assert_eq!(data, want, "round {round}");
            let got = records
                .recv_timeout(DEADLINE)
                .unwrap_or_else(|e| panic!("round {round}: no binary record ({e})"));
            assert_eq!(Bytes::from(got), Bytes::from(want), "round {round}");
        }
        assert_eq!(at, appended.end_lsn);
    }
}

/// `GET /wal` with `query`, answered with any status: the status code, the content type and
/// the whole body.
fn get_wal_any(http: SocketAddr, query: &str) -> (u16, String, Vec<u8>) {
    let mut resp = ureq::get(&format!("http://{http}/wal?{query}"))
        .config()
        .http_status_as_error(false)
        .build()
        .call()
        .expect("GET /wal");
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let mut body = Vec::new();
    resp.body_mut()
        .as_reader()
        .read_to_end(&mut body)
        .expect("read the body");
    (status, content_type, body)
}

/// `GET /wal` with `query` in NDJSON, `format=binary` and `follow=true` alike: the error status
/// and its JSON body, which is the whole answer (no record before or after it).
fn get_wal_error(http: SocketAddr, query: &str, status: u16) -> serde_json::Value {
    let mut bodies = Vec::new();
    for extra in [
        "",
        "&format=binary",
        "&follow=true",
        "&follow=true&format=binary",
    ] {
        let q = format!("{query}{extra}");
        let (got, content_type, body) = get_wal_any(http, &q);
        let text = String::from_utf8_lossy(&body).to_string();
        assert_eq!(got, status, "GET /wal?{q}: {text}");
        assert_eq!(content_type, "application/json", "GET /wal?{q}");
        let json: serde_json::Value = serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("GET /wal?{q}: not one JSON object ({e}): {text}"));
        assert!(json["error"].is_string(), "GET /wal?{q}: {json}");
        bodies.push(json);
    }
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "the format and follow do not change the error: {bodies:?}"
    );
    bodies.remove(0)
}

/// `GET /wal` answers each mistake with an error status and a JSON body before any record:
/// `0/0` is 400; a position whose WAL retention removed is 410 naming the oldest LSN kept,
/// from which `from=earliest` reads; a position inside a record is 400 naming the record's
/// start, not a corruption report; a position beyond the durable end is 400.
#[test]
fn get_wal_answers_errors_before_any_record() {
    let node = TestNode::primary("");
    let start = node.wal().flushed();
    append_mib(&node, 3, 1);
    node.wal().run_retention().expect("retention");
    let oldest = node.wal().oldest_retained();
    assert!(oldest > start, "retention removed the first segments");
    // Records that start in the segment kept (the one before may only continue into it).
    node.append(5, 100, 9);

    let json = get_wal_error(node.http_addr, "from=0/0", 400);
    assert!(json["error"].as_str().unwrap().contains("0/0"), "{json}");
    let json = get_wal_error(node.http_addr, "from=nonsense", 400);
    assert!(
        json["error"].as_str().unwrap().contains("nonsense"),
        "{json}"
    );

    let json = get_wal_error(node.http_addr, &format!("from={start}"), 410);
    assert_eq!(json["oldest_lsn"], serde_json::json!(oldest.to_string()));
    assert!(
        json["error"]
            .as_str()
            .unwrap()
            .contains(&oldest.to_string()),
        "{json}"
    );

    // from=earliest reads from the oldest record kept to the end.
    let want = read_records(&node, oldest);
    let (status, content_type, body) = get_wal_any(node.http_addr, "from=earliest");
    assert_eq!(status, 200);
    assert_eq!(content_type, "application/x-ndjson");
    let lines: Vec<serde_json::Value> = body
        .lines()
        .map(|l| serde_json::from_str(&l.expect("a line")).expect("JSON"))
        .collect();
    assert_eq!(lines.len(), want.len());
    let RecordEvent::Record { start: first, .. } = &want[0] else {
        panic!("{:?}", want[0])
    };
    assert_eq!(lines[0]["start"], serde_json::json!(first.to_string()));
    assert_eq!(
        lines.last().unwrap()["end"],
        serde_json::json!(node.wal().flushed().to_string())
    );

    // Inside the second record kept: a 400 naming where that record and the next start.
    let RecordEvent::Record { start: r, end, .. } = &want[1] else {
        panic!("{:?}", want[1])
    };
    let inside = Lsn(r.0 + 8);
    let json = get_wal_error(node.http_addr, &format!("from={inside}"), 400);
    let text = json["error"].as_str().unwrap();
    assert!(text.contains("not a record boundary"), "{text}");
    assert!(text.contains(&r.to_string()), "{text}");
    assert!(text.contains(&end.to_string()), "{text}");
    assert!(!text.to_lowercase().contains("corrupt"), "{text}");
    // Inside the kept segment's header: no record starts there either.
    let json = get_wal_error(node.http_addr, &format!("from={}", Lsn(oldest.0 + 8)), 400);
    assert!(
        json["error"]
            .as_str()
            .unwrap()
            .contains("not a record boundary"),
        "{json}"
    );
    // ... and the record boundary itself reads.
    let (status, _, body) = get_wal_any(node.http_addr, &format!("from={r}"));
    assert_eq!(status, 200);
    assert_eq!(body.lines().count(), want.len() - 1);

    let ahead = Lsn(node.wal().flushed().0 + 8);
    let json = get_wal_error(node.http_addr, &format!("from={ahead}"), 400);
    assert!(
        json["error"].as_str().unwrap().contains("ahead of"),
        "{json}"
    );
}

/// An unknown parameter of the admin API is a 400 naming it, never a default taken silently:
/// a misspelt `durability` appends nothing, and endpoints without parameters refuse any.
#[test]
fn admin_api_refuses_unknown_query_parameters() {
    let node = TestNode::primary("");
    let before = node.wal().flushed();
    let (status, json) = http_post(node.http_addr, "/wal?durabilty=on", b"record");
    assert_eq!(status, 400, "{json}");
    assert!(
        json["error"].as_str().unwrap().contains("durabilty"),
        "{json}"
    );
    assert_eq!(node.wal().flushed(), before, "nothing was appended");
    let (status, json) = http_post(node.http_addr, "/wal?durability=on", b"record");
    assert_eq!(status, 200, "{json}");

    let json = get_wal_error(node.http_addr, &format!("from={before}&folow=true"), 400);
    assert!(json["error"].as_str().unwrap().contains("folow"), "{json}");

    for path in ["/status?verbose=1", "/slots?name=x", "/metrics?format=json"] {
        let (status, text) = http_get_any(node.http_addr, path);
        assert_eq!(status, 400, "{path}: {text}");
        let json: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        let name = path.split(['?', '=']).nth(1).unwrap();
        assert!(
            json["error"].as_str().unwrap().contains(name),
            "{path}: {json}"
        );
    }
    for path in ["/promote?now=1", "/reload?force=1"] {
        let (status, json) = http_post(node.http_addr, path, b"");
        assert_eq!(status, 400, "{path}: {json}");
        let name = path.split(['?', '=']).nth(1).unwrap();
        assert!(
            json["error"].as_str().unwrap().contains(name),
            "{path}: {json}"
        );
    }
}

/// Every error of the stand-alone admin API is a JSON object with an `error` text, those
/// actix-web would answer in plain text or with an empty body too: a body declared over the
/// limit is refused with 413 before it is read (and appends nothing), and a method and path
/// with no endpoint is a 404 naming them.
#[test]
fn admin_api_errors_are_json_everywhere() {
    let node = TestNode::primary("");
    let before = node.wal().flushed();
    // Only the head: a body of this length is never sent, so the answer must come first.
    let mut tcp = std::net::TcpStream::connect(node.http_addr).expect("connect");
    tcp.set_read_timeout(Some(DEADLINE)).expect("timeout");
    std::io::Write::write_all(
        &mut tcp,
        b"POST /wal HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: 100000000\r\n\r\n",
    )
    .expect("send the head");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") || !answer.ends_with(b"}") {
        let n = std::io::Read::read(&mut tcp, &mut buf).expect("read the answer");
        assert!(
            n > 0,
            "closed before a whole answer: {:?}",
            String::from_utf8_lossy(&answer)
        );
        answer.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&answer).to_string();
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{text}"
    );
    let body = &text[text.find("\r\n\r\n").expect("head") + 4..];
    let json: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert!(json["error"].as_str().unwrap().contains("limit"), "{json}");
    assert_eq!(node.wal().flushed(), before, "nothing was appended");

    for (method, path) in [("GET", "/nosuch"), ("DELETE", "/status")] {
        let mut resp = ureq::http::Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", node.http_addr))
            .body(())
            .map(|r| {
                ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .build()
                    .new_agent()
                    .run(r)
            })
            .expect("a request")
            .expect("an answer");
        assert_eq!(resp.status().as_u16(), 404, "{method} {path}");
        let text = resp.body_mut().read_to_string().expect("answer");
        let json: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(
            json["error"].as_str(),
            Some(format!("no endpoint {method} {path}").as_str()),
            "{json}"
        );
    }
}
