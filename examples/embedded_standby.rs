//! An actix-web application that embeds a walserver standby and serves its status: the
//! standby's admin API (`/status`, `/slots`, `/metrics`, `/wal`) is mounted under
//! `/walserver` in the application's own `App`, beside the application's routes.
//!
//! `cargo run --example embedded_standby -- 'host=HOST port=5433 user=USER'` embeds a standby
//! of that upstream (a libpq conninfo; `WALSERVER_UPSTREAM` works too), made in a temporary
//! directory on the first start. Without one it also starts a primary to stream from, so it
//! runs alone. It prints its address and serves until Ctrl-C. `cargo test --example
//! embedded_standby` runs its test.

use actix_web::{web, App, HttpResponse, HttpServer};
use supervisor_actor::{Node, NodeBuilder};

/// The application: its nodes and its address.
pub struct Embedded {
    /// The primary the example started, when no upstream was given.
    pub primary: Option<Node>,
    pub standby: Node,
    pub http: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

/// The application_name the standby uses upstream, which a primary can name in
/// `synchronous_standby_names`.
pub const STANDBY_NAME: &str = "embedded_standby";

/// Starts the standby (of `upstream`, or of a primary started here) and the application, in
/// the current actix System.
pub async fn start(upstream: Option<String>) -> anyhow::Result<Embedded> {
    let dir = tempfile::tempdir()?;
    let (primary, conninfo) = match upstream {
        Some(conninfo) => (None, conninfo),
        None => {
            let primary = NodeBuilder::primary(dir.path().join("primary"))
                .listen("127.0.0.1:0".parse()?)
                .synchronous_standby_names(STANDBY_NAME)?
                .start()
                .await?;
            let conninfo = format!(
                "host=127.0.0.1 port={} user=app",
                primary.listen_addr.port()
            );
            (Some(primary), conninfo)
        }
    };
    let standby = NodeBuilder::standby(dir.path().join("standby"), &conninfo)?
        .cluster_name(STANDBY_NAME)
        .listen("127.0.0.1:0".parse()?)
        .start()
        .await?;

    let node = standby.clone();
    let server = HttpServer::new(move || {
        App::new()
            // The application's own routes.
            .route(
                "/",
                web::get().to(|| async {
                    HttpResponse::Ok().body("an application; its standby is under /walserver\n")
                }),
            )
            // The standby's admin API, on the application's routes.
            .service(web::scope("/walserver").configure(walserver::http::configure(node.clone())))
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")?;
    let http = server.addrs()[0];
    actix_rt::spawn(server.run());
    Ok(Embedded {
        primary,
        standby,
        http,
        _dir: dir,
    })
}

#[cfg_attr(test, allow(dead_code))]
fn main() -> anyhow::Result<()> {
    let upstream = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("WALSERVER_UPSTREAM").ok());
    actix_rt::System::new().block_on(async {
        let app = start(upstream).await?;
        println!("status: curl http://{}/walserver/status", app.http);
        tokio::signal::ctrl_c().await?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use supervisor_actor::{AppendRecords, Durability};
    use wal_storage::Lsn;

    /// How long the test waits for the application to start and append, and for each
    /// request's answer: the example takes milliseconds for either, so a hang fails the test
    /// here, saying what it waited for, rather than at the test run's limit. A guess, far
    /// above the time taken.
    const DEADLINE: Duration = Duration::from_secs(30);

    /// A client whose requests give up after [`DEADLINE`] and take any status as an answer.
    fn client() -> ureq::Agent {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(DEADLINE))
            .build()
            .into()
    }

    /// Fails the test with the request that had no answer.
    fn no_answer(what: &str, url: &str, e: ureq::Error) -> ! {
        panic!("{what} {url} (waiting up to {} s): {e}", DEADLINE.as_secs())
    }

    fn get(url: &str) -> (u16, String) {
        let mut resp = client()
            .get(url)
            .call()
            .unwrap_or_else(|e| no_answer("GET", url, e));
        let status = resp.status().as_u16();
        (status, resp.body_mut().read_to_string().expect("a body"))
    }

    /// The application serves the standby's status through the mounted admin API, on its own
    /// socket, beside its own routes.
    #[test]
    fn the_application_serves_its_standby_s_status_on_its_own_routes() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            actix_rt::System::new().block_on(async {
                let app = super::start(None).await.expect("start");
                let primary = app.primary.clone().expect("a primary of its own");
                let from = primary.wal.flushed();
                // The standby is synchronous: once this returns, it has flushed the record.
                let appended = primary
                    .supervisor
                    .send(AppendRecords {
                        records: vec![Bytes::from("embedded")],
                        durability: Some(Durability::On),
                    })
                    .await
                    .expect("the supervisor")
                    .expect("appended");
                // Under the overlapped commit (the default) the standby's readers stop at the
                // commit point the primary told it, which follows the acknowledgement by a
                // message and a write: wait for it as a reader's wake-up would.
                let mut seen = app.standby.wal.subscribe();
                tokio::time::timeout(
                    DEADLINE,
                    seen.wait_for(|p| p.sendable() >= appended.end_lsn),
                )
                .await
                .expect("the standby is told the commit point")
                .expect("the standby's storage is open");
                tx.send((app.http, primary.wal.system_id(), from, appended.end_lsn))
                    .unwrap();
                // Keep the application alive while the test runs.
                let _app = app;
                std::future::pending::<()>().await;
            });
        });
        let (http, system_id, from, end) = rx.recv_timeout(DEADLINE).unwrap_or_else(|e| {
            panic!(
                "waited {} s for the application to start and its standby to confirm an \
                 append: {e}",
                DEADLINE.as_secs()
            )
        });

        let (code, body) = get(&format!("http://{http}/walserver/status"));
        assert_eq!(code, 200, "{body}");
        let status: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(status["role"], "standby", "{status}");
        assert_eq!(
            status["system_identifier"],
            serde_json::to_value(system_id).unwrap(),
            "{status}"
        );
        let flushed: Lsn = status["flush_lsn"].as_str().unwrap().parse().unwrap();
        assert!(flushed >= end, "{status}");

        // The records the standby received, through the mounted GET /wal.
        let (code, body) = get(&format!("http://{http}/walserver/wal?from={from}"));
        assert_eq!(code, 200, "{body}");
        let first: serde_json::Value =
            serde_json::from_str(body.lines().next().expect("a record")).unwrap();
        assert_eq!(
            first["data"], "ZW1iZWRkZWQ=",
            "base64 of \"embedded\": {body}"
        );

        // POST /wal is mounted and takes bodies past actix-web's default limit (256 KiB): a
        // standby refuses the append itself, with a conflict, not a 413.
        let wal = format!("http://{http}/walserver/wal");
        let append = client()
            .post(&wal)
            .send(&vec![b'x'; 1 << 20][..])
            .unwrap_or_else(|e| no_answer("POST", &wal, e));
        assert_eq!(append.status().as_u16(), 409);

        // The application's own route, and no stand-alone-only route.
        assert_eq!(get(&format!("http://{http}/")).0, 200);
        let url = format!("http://{http}/walserver/promote");
        let promote = client()
            .post(&url)
            .send_empty()
            .unwrap_or_else(|e| no_answer("POST", &url, e));
        assert_eq!(promote.status().as_u16(), 404);
    }
}
