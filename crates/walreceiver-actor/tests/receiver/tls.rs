//! TLS by sslmode, against a walserver primary that offers it and one that does not.

use std::path::PathBuf;

use wal_storage::{Lsn, TimelineId};
use walreceiver_actor::{ReceiverError, StopReason};

use crate::common::*;

/// A self-signed certificate for `localhost`, written as PEM files in `dir`.
fn certificate(dir: &std::path::Path) -> (PathBuf, PathBuf) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = dir.join("server.crt");
    let key = dir.join("server.key");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    (cert, key)
}

fn conninfo(primary: &Primary, host: &str, tail: &str) -> protocol_codec::conninfo::ConnInfo {
    protocol_codec::conninfo::ConnInfo::parse(&format!(
        "host={host} port={} user=repl {tail}",
        primary.addr.port()
    ))
    .unwrap()
}

#[actix_rt::test]
async fn verify_full_streams_over_tls_and_refuses_a_wrong_host_name() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (cert, key) = certificate(dirs.0.path());
    let primary = Primary::start_tls(
        primary_wal(&dirs.0.path().join("data")),
        Access::Trust,
        Some((&cert, &key)),
    );
    append(&primary.wal, 50, 4000).await;
    let standby = standby_wal(dirs.1.path(), SYSTEM);

    // The certificate names localhost, not 127.0.0.1.
    let tail = format!("sslmode=verify-full sslrootcert={}", cert.display());
    let mut r = Receiving::start(
        receiver_config(conninfo(&primary, "127.0.0.1", &tail)),
        &standby,
    );
    let stopped = r.stopped().await;
    assert!(
        matches!(
            stopped.reason,
            StopReason::Failed(ReceiverError::Tls { .. })
        ),
        "{}",
        stopped.reason
    );

    let mut r = Receiving::start(
        receiver_config(conninfo(&primary, "localhost", &tail)),
        &standby,
    );
    r.streaming().await;
    let end = primary.wal.flushed();
    r.wait_flushed(&standby, TimelineId(1), end).await;
    assert_same_wal(&primary.wal, &standby, TimelineId(1), Lsn(SEGMENT), end);
}

#[actix_rt::test]
async fn require_refuses_a_plaintext_upstream_and_prefer_accepts_it() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let primary = Primary::start(primary_wal(dirs.0.path()), Access::Trust);
    let standby = standby_wal(dirs.1.path(), SYSTEM);
    let mut r = Receiving::start(
        receiver_config(conninfo(&primary, "127.0.0.1", "sslmode=require")),
        &standby,
    );
    let stopped = r.stopped().await;
    match &stopped.reason {
        StopReason::Failed(ReceiverError::Tls { message }) => {
            assert!(message.contains("does not support SSL"), "{message}")
        }
        other => panic!("{other}"),
    }
    let mut r = Receiving::start(
        receiver_config(conninfo(&primary, "127.0.0.1", "sslmode=prefer")),
        &standby,
    );
    r.streaming().await;
}

/// `channel_binding=require`, as libpq takes it in `primary_conninfo`: the walreceiver streams
/// from a primary that authenticates it with SCRAM bound to the certificate it presented
/// (SCRAM-SHA-256-PLUS), and refuses one that lets it in without such an exchange.
#[actix_rt::test]
async fn channel_binding_require_streams_only_after_a_bound_scram_exchange() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (cert, key) = certificate(dirs.0.path());
    let tail = format!(
        "sslmode=verify-full sslrootcert={} channel_binding=require password=pw",
        cert.display()
    );

    let trusting = Primary::start_tls(
        primary_wal(&dirs.0.path().join("trusting")),
        Access::Trust,
        Some((&cert, &key)),
    );
    let standby = standby_wal(dirs.1.path(), SYSTEM);
    let mut r = Receiving::start(
        receiver_config(conninfo(&trusting, "localhost", &tail)),
        &standby,
    );
    match &r.stopped().await.reason {
        StopReason::Failed(ReceiverError::Authentication { message }) => assert_eq!(
            message,
            "channel binding required, but server authenticated client without channel binding"
        ),
        other => panic!("{other}"),
    }

    let binding = Primary::start_tls(
        primary_wal(&dirs.0.path().join("binding")),
        Access::Scram {
            user: "repl",
            password: "pw",
        },
        Some((&cert, &key)),
    );
    append(&binding.wal, 50, 4000).await;
    let mut r = Receiving::start(
        receiver_config(conninfo(&binding, "localhost", &tail)),
        &standby,
    );
    r.streaming().await;
    let end = binding.wal.flushed();
    r.wait_flushed(&standby, TimelineId(1), end).await;
    assert_same_wal(&binding.wal, &standby, TimelineId(1), Lsn(SEGMENT), end);
}
