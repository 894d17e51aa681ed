//! PostgreSQL's point-in-time recovery from walserver's archive: a walserver relay of a
//! PostgreSQL 15 primary archives what it relays to a SeaweedFS bucket (S3, zstd-compressed);
//! a base backup of the primary without WAL, restored with
//! `restore_command = 'walserver restore-wal ...'` reading that bucket and a recovery target
//! (an LSN, then a time), holds exactly the rows committed up to the target.
//!
//! A relay is a standby, so it archives only with `archive_mode = "always"`, as a PostgreSQL
//! standby does; `on` archives on a primary alone.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use pg_testkit::{
    PgCluster, PgOptions, SeaweedServer, SEAWEED_ACCESS_KEY_ID, SEAWEED_SECRET_ACCESS_KEY,
};
use wal_storage::segment_file_name;

use super::*;

/// Rows with an id below this are committed before the targets; the rest after them.
const BEFORE: i64 = 2_000;

/// The key prefix of the relay's archive in the bucket.
const PREFIX: &str = "relay";

/// A temporary directory the `postgres` user can read, for the configuration
/// `restore_command` reads.
fn shared_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod the shared directory");
    dir
}

/// The restored server's rows summarised, and the primary's rows below `BEFORE` the same way.
fn rows_before(pg: &PgCluster) -> String {
    pg.psql(&format!(
        "SELECT count(*), sum(id), sum(length(filler)) FROM t WHERE id < {BEFORE}"
    ))
}

/// Starts a server from `backup` recovering through `restore_command` up to `target` (the
/// recovery target's settings) and waits until it has promoted.
fn recover(backup: &pg_testkit::BaseBackup, restore_command: &str, target: &[String]) -> PgCluster {
    let mut opts = PgOptions::default()
        .conf(format!("restore_command = '{restore_command}'"))
        .conf("recovery_target_action = 'promote'");
    for line in target {
        opts = opts.conf(line.clone());
    }
    let r = PgCluster::recover_from(backup, &opts);
    assert!(
        r.wait_for("SELECT pg_is_in_recovery()", "f", DEADLINE),
        "recovery did not end; server log:\n{}",
        r.log()
    );
    r
}

#[test]
fn postgresql_recovers_to_an_lsn_and_a_time_from_a_relays_archive() {
    let pg = pg_primary();
    let store = SeaweedServer::start();
    // The archive's settings, for the relay and for `restore-wal`: top-level lines, then the
    // `[archive]` table.
    let (top, table) = (
        format!(
            "archive_target = \"s3://{}/{PREFIX}\"\narchive_compression = \"zstd\"\n",
            store.bucket()
        ),
        format!(
            "[archive]\nendpoint = {:?}\nallow_http = true\naccess_key_id = \
             {SEAWEED_ACCESS_KEY_ID:?}\nsecret_access_key = {SEAWEED_SECRET_ACCESS_KEY:?}\n",
            store.endpoint()
        ),
    );
    let relay = TestNode::standby_from(
        &format!(
            "{} application_name=walserver connect_timeout=10",
            pg.conninfo("postgres", None)
        ),
        &format!("archive_mode = \"always\"\n{top}{table}"),
    );
    relay.wait_receiver("the relay to stream from PostgreSQL", |_| true);
    let backup = pg.base_backup();

    write_load(&pg, 0, BEFORE);
    let target_lsn = pg.psql("SELECT pg_current_wal_insert_lsn()");
    // Read after the commit above returned and before the one below starts, so the
    // first commit's timestamp is at or before it and the second's after it.
    let target_time = pg.psql("SELECT clock_timestamp()");
    write_load(&pg, BEFORE, 3_000);
    let last: Lsn = flush_lsn(&pg);
    pg.psql("SELECT pg_switch_wal()");
    let expected = rows_before(&pg);
    assert_ne!(expected, rows(&pg), "rows were committed after the targets");

    // The segment holding the later rows is archived by the relay.
    let last_segment = segment_file_name(TL1, last.segment_number(PG_SEGMENT), PG_SEGMENT);
    let object = format!("{PREFIX}/{last_segment}.zst");
    wait_until(&format!("the relay to archive {object}"), || {
        store.get_raw(&object).is_ok_and(|o| o.is_some())
    });

    let dir = shared_tempdir();
    let config = dir.path().join("restore.toml");
    std::fs::write(&config, format!("{top}{table}")).expect("write the restore configuration");
    let restore_command = format!(
        "{} restore-wal --config {} %f %p",
        env!("CARGO_BIN_EXE_walserver"),
        config.display()
    );
    for target in [
        vec![
            format!("recovery_target_lsn = '{target_lsn}'"),
            // Stop before the first record at the target: the next transaction's.
            "recovery_target_inclusive = off".to_string(),
        ],
        vec![format!("recovery_target_time = '{target_time}'")],
    ] {
        let r = recover(&backup, &restore_command, &target);
        assert_eq!(rows(&r), expected, "{target:?}; server log:\n{}", r.log());
        assert!(
            r.log().contains("recovery stopping before"),
            "{target:?}: recovery did not stop at its target; server log:\n{}",
            r.log()
        );
    }
    drop(relay);
    assert_restore_wal_exit_codes(&store, &config, &last_segment);
}

/// `restore-wal` exits 1 for a file the archive lacks and 200 for a damaged one, writing
/// nothing either time.
fn assert_restore_wal_exit_codes(store: &SeaweedServer, config: &Path, segment: &str) {
    let out = tempfile::tempdir().expect("tempdir");
    let dest = out.path().join("RECOVERYXLOG");
    let restore = |name: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_walserver"))
            .args(["restore-wal", "--config"])
            .arg(config)
            .arg(name)
            .arg(&dest)
            .output()
            .expect("run walserver restore-wal")
    };
    let missing = restore("00000009.history");
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    assert!(!dest.exists());
    let object = format!("{PREFIX}/{segment}.zst");
    let mut bytes = store
        .get_raw(&object)
        .expect("read the archived segment")
        .expect("the archived segment");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    store
        .put_raw(&object, &bytes)
        .expect("damage the archived segment");
    let damaged = restore(segment);
    assert_eq!(damaged.status.code(), Some(200), "{damaged:?}");
    let stderr = String::from_utf8_lossy(&damaged.stderr);
    assert!(
        stderr.contains(segment) && stderr.contains("corrupt"),
        "{stderr}"
    );
    assert!(!dest.exists());
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
}
