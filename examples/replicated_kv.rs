//! A replicated key-value store on walserver: writes go through walserver as records, a
//! standby applies them, and a read on the standby after a `remote_apply` write sees it.
//!
//! It starts, in one process, a walserver primary and a standby (walserver's actors embedded
//! in this actix application), and two actix-web front ends:
//!
//! - the writer, on the primary: `PUT /kv/{key}` with the value as the body appends a record
//!   `key\0value` with `remote_apply` and answers with its LSN once the standby's
//!   application has applied it (the standby is synchronous: `synchronous_standby_names`);
//! - the reader, on the standby: `GET /kv/{key}` from the map the standby's application
//!   keeps by applying records in LSN order (and reporting what it applied upstream).
//!
//! Run it with `cargo run --example replicated_kv`; it prints the two addresses and serves
//! until Ctrl-C. `cargo test --example replicated_kv` runs its test.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use actix_web::{web, App, HttpResponse, HttpServer};
use bytes::Bytes;
use futures_util::StreamExt;
use supervisor_actor::{AppendRecords, Durability, Follow, Node, NodeBuilder, RecordEvent};

type Map = Arc<RwLock<HashMap<String, Bytes>>>;

/// The store: its nodes and the addresses of its front ends.
pub struct Store {
    pub primary: Node,
    pub standby: Node,
    pub writer: std::net::SocketAddr,
    pub reader: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

fn encode(key: &str, value: &[u8]) -> Bytes {
    let mut r = key.as_bytes().to_vec();
    r.push(0);
    r.extend_from_slice(value);
    Bytes::from(r)
}

fn decode(record: &Bytes) -> Option<(String, Bytes)> {
    let nul = record.iter().position(|b| *b == 0)?;
    let key = std::str::from_utf8(&record[..nul]).ok()?.to_string();
    Some((key, record.slice(nul + 1..)))
}

/// Starts the primary, the standby, its applier and both front ends in the current actix System.
pub async fn start() -> anyhow::Result<Store> {
    let dir = tempfile::tempdir()?;
    // The primary: a new system, the standby named "kv_standby" synchronous.
    let primary = NodeBuilder::primary(dir.path().join("primary"))
        .listen("127.0.0.1:0".parse()?)
        .segment_size(1 << 20)
        .synchronous_standby_names("kv_standby")?
        .synchronous_commit(Durability::RemoteApply)
        .start()
        .await?;

    // The standby adopts the primary's identity and streams from it.
    let conninfo = format!(
        "host=127.0.0.1 port={} user=kv application_name=kv_standby",
        primary.listen_addr.port()
    );
    let standby = NodeBuilder::standby(dir.path().join("standby"), &conninfo)?
        .listen("127.0.0.1:0".parse()?)
        .start()
        .await?;

    // The standby's application: apply records in LSN order, report each.
    let map: Map = Arc::default();
    let start = standby.wal.flushed();
    standby.report_applied(start);
    let (node, m) = (standby.clone(), map.clone());
    actix_rt::spawn(async move {
        let mut records = Box::pin(node.records(start, Follow::Forever));
        while let Some(ev) = records.next().await {
            match ev {
                Ok(RecordEvent::Record { end, payload, .. }) => {
                    if let Some((k, v)) = decode(&payload) {
                        m.write().unwrap_or_else(|e| e.into_inner()).insert(k, v);
                    }
                    node.report_applied(end);
                }
                Ok(RecordEvent::TimelineSwitch { .. }) => {}
                Err(e) => {
                    eprintln!("applier stopped: {e}");
                    return;
                }
            }
        }
    });

    let p = primary.clone();
    let writer = HttpServer::new(move || {
        App::new().app_data(web::Data::new(p.clone())).route(
            "/kv/{key}",
            web::put().to(
                |node: web::Data<Node>, key: web::Path<String>, body: Bytes| async move {
                    let append = AppendRecords {
                        records: vec![encode(&key, &body)],
                        durability: Some(Durability::RemoteApply),
                    };
                    match node.supervisor.send(append).await {
                        Ok(Ok(a)) => HttpResponse::Ok().body(a.end_lsn.to_string()),
                        Ok(Err(e)) => HttpResponse::ServiceUnavailable().body(e.to_string()),
                        Err(e) => HttpResponse::InternalServerError().body(e.to_string()),
                    }
                },
            ),
        )
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")?;
    let writer_addr = writer.addrs()[0];
    actix_rt::spawn(writer.run());

    let reader = HttpServer::new(move || {
        App::new().app_data(web::Data::new(map.clone())).route(
            "/kv/{key}",
            web::get().to(|map: web::Data<Map>, key: web::Path<String>| async move {
                match map
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(key.as_str())
                {
                    Some(v) => HttpResponse::Ok().body(v.clone()),
                    None => HttpResponse::NotFound().finish(),
                }
            }),
        )
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")?;
    let reader_addr = reader.addrs()[0];
    actix_rt::spawn(reader.run());

    Ok(Store {
        primary,
        standby,
        writer: writer_addr,
        reader: reader_addr,
        _dir: dir,
    })
}

#[cfg_attr(test, allow(dead_code))]
fn main() -> anyhow::Result<()> {
    actix_rt::System::new().block_on(async {
        let store = start().await?;
        println!(
            "writes: curl -X PUT --data-binary VALUE http://{}/kv/KEY",
            store.writer
        );
        println!("reads:  curl http://{}/kv/KEY", store.reader);
        tokio::signal::ctrl_c().await?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// How long the test waits for the store to start, and for each request's answer: the
    /// example takes milliseconds for either, so a hang fails the test here, saying what it
    /// waited for, rather than at the test run's limit. A guess, far above the time taken.
    const DEADLINE: Duration = Duration::from_secs(30);

    /// A read on the standby after a `remote_apply` write sees the value.
    #[test]
    fn a_read_on_the_standby_after_a_remote_apply_write_sees_it() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let system = actix_rt::System::new();
            system.block_on(async {
                let store = super::start().await.expect("start");
                tx.send((store.writer, store.reader)).unwrap();
                // Keep the store alive while the test runs.
                std::future::pending::<()>().await;
            });
        });
        let (writer, reader) = rx.recv_timeout(DEADLINE).unwrap_or_else(|e| {
            panic!(
                "waited {} s for the store to start: {e}",
                DEADLINE.as_secs()
            )
        });
        let http: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(DEADLINE))
            .build()
            .into();
        let waited = |what: String, e: ureq::Error| -> ! {
            panic!("{what} (waiting up to {} s): {e}", DEADLINE.as_secs())
        };
        for i in 0..20 {
            let value = format!("value {i}");
            let put = format!("http://{writer}/kv/k{}", i % 3);
            let resp = http
                .put(&put)
                .send(value.as_bytes())
                .unwrap_or_else(|e| waited(format!("PUT {put}"), e));
            assert!(resp.status().is_success());
            // No waiting, no retry: remote_apply means the standby has applied it.
            let get = format!("http://{reader}/kv/k{}", i % 3);
            let mut got = http
                .get(&get)
                .call()
                .unwrap_or_else(|e| waited(format!("GET {get}"), e));
            assert_eq!(got.body_mut().read_to_string().unwrap(), value);
        }
    }
}
