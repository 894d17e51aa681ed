//! pgBackRest as walserver's `archive_command`: a walserver relay of a PostgreSQL 15 primary
//! hands each completed segment to `pgbackrest archive-push %p`, which stores it in a
//! pgBackRest repository on SeaweedFS (S3 over https, which is all pgBackRest 2.45 speaks to
//! S3: SeaweedFS serves it with a throwaway CA's certificate, which pgBackRest verifies), and
//! `pgbackrest archive-get` gives back PostgreSQL's bytes.
//!
//! pgBackRest runs synchronously here: its asynchronous mode looks for PostgreSQL's
//! `archive_status/*.ready` beside `%p`, and walserver's `%p` is a file of its own staging
//! directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pg_testkit::{SeaweedServer, SEAWEED_ACCESS_KEY_ID, SEAWEED_SECRET_ACCESS_KEY};
use wal_storage::segment_file_name;

use super::*;

const INSTALL_HINT: &str =
    "pgBackRest is required: ./scripts/test.sh installs it (apt-get install pgbackrest)";

/// `pgbackrest` on PATH; panics with the install hint without it.
fn pgbackrest() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("pgbackrest"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{INSTALL_HINT}"))
}

/// Runs pgBackRest with the configuration `conf` and the stanza `relay`.
fn run(conf: &Path, args: &[&str]) -> Output {
    Command::new(pgbackrest())
        .arg(format!("--config={}", conf.display()))
        .arg("--stanza=relay")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run pgbackrest: {e}. {INSTALL_HINT}"))
}

#[test]
fn pgbackrest_archives_a_relays_segments_through_archive_command_and_gets_them_back() {
    let pg = pg_primary();
    let store = SeaweedServer::start_with_https();
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("pgbackrest.conf");
    std::fs::write(
        &conf,
        format!(
            "[global]\n\
             repo1-type=s3\n\
             repo1-path=/pgbackrest\n\
             repo1-s3-bucket={bucket}\n\
             repo1-s3-endpoint=127.0.0.1\n\
             repo1-storage-port={port}\n\
             repo1-s3-uri-style=path\n\
             repo1-storage-ca-file={ca}\n\
             repo1-s3-region=us-east-1\n\
             repo1-s3-key={SEAWEED_ACCESS_KEY_ID}\n\
             repo1-s3-key-secret={SEAWEED_SECRET_ACCESS_KEY}\n\
             lock-path={d}/lock\n\
             log-path={d}/log\n\
             spool-path={d}/spool\n\
             log-level-console=error\n\
             log-level-file=off\n\
             \n\
             [relay]\n\
             pg1-path={pgdata}\n",
            bucket = store.bucket(),
            port = store.https_port().expect("https"),
            ca = store.ca_file().expect("https").display(),
            d = dir.path().display(),
            pgdata = pg.data_dir().display(),
        ),
    )
    .expect("write pgbackrest.conf");
    // The stanza from the primary's pg_control (its system identifier, which the relay's WAL
    // carries and archive-push checks).
    let created = run(&conf, &["--no-online", "stanza-create"]);
    assert!(created.status.success(), "stanza-create: {created:?}");

    let relay = TestNode::standby_from(
        &format!(
            "{} application_name=walserver connect_timeout=10",
            pg.conninfo("postgres", None)
        ),
        &format!(
            "archive_mode = \"always\"\n\
             archive_command = \"{} --config={} --stanza=relay archive-push %p\"\n",
            pgbackrest().display(),
            conf.display()
        ),
    );
    relay.wait_receiver("the relay to stream from PostgreSQL", |_| true);
    let first = relay.wal().flushed().segment_number(PG_SEGMENT);
    write_load(&pg, 0, 100_000);
    let last = flush_lsn(&pg).segment_number(PG_SEGMENT);
    pg.psql("SELECT pg_switch_wal()");
    let last_name = segment_file_name(TL1, last, PG_SEGMENT);
    wait_until(&format!("the relay to archive {last_name}"), || {
        let status = relay.http_get("/status");
        status["archiver"]["last_archived_wal"].as_str() == Some(last_name.as_str())
    });
    let status = relay.http_get("/status");
    assert_eq!(status["archiver"]["failed_count"], 0, "{status}");
    assert!(last > first, "the load filled no segment");

    // Every segment the relay archived comes back from pgBackRest as PostgreSQL wrote it.
    let out = dir.path().join("restored");
    for segno in first..=last {
        let name = segment_file_name(TL1, segno, PG_SEGMENT);
        let got = run(&conf, &["archive-get", &name, &out.display().to_string()]);
        assert!(got.status.success(), "archive-get {name}: {got:?}");
        let theirs = read_file(&pg.data_dir().join("pg_wal").join(&name));
        assert!(
            read_file(&out) == theirs,
            "{name} differs from PostgreSQL's"
        );
        std::fs::remove_file(&out).expect("remove the restored segment");
    }
    // A segment never archived is not there: archive-get says so with exit status 1.
    let missing = segment_file_name(TL1, last + 5, PG_SEGMENT);
    let got = run(
        &conf,
        &["archive-get", &missing, &out.display().to_string()],
    );
    assert_eq!(got.status.code(), Some(1), "archive-get {missing}: {got:?}");
    assert!(!out.exists());
}
