//! `archive_mode`, `archive_target`, `archive_command`, `archive_timeout`,
//! `archive_max_backlog`, `archive_compression`, `archive_compression_level` and the
//! `[archive]` table: continuous archiving in the
//! configuration's words, and the archiver a node runs beside its actors.
//!
//! `archive_mode` is PostgreSQL's: `off` (the default), `on` (a primary archives) or
//! `always` (every node archives what it stores). `archive_target` names the archive as a URL:
//! a directory, `file:///path`, or an S3 bucket and key prefix, `s3://bucket/prefix`, whose
//! service the `[archive]` table describes (`endpoint`, `region`, `allow_http`) with its
//! credentials (`access_key_id`, `secret_access_key`, else the standard `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN` variables) and the part size of its
//! multipart uploads (`multipart_part_size`). `archive_command` instead
//! hands each file to a shell command with PostgreSQL's `%p` / `%f` contract (WAL-G,
//! pgBackRest, barman-cloud), staged in `DATA/archive_staging`. `archive_timeout` (seconds,
//! 0 = off) bounds how long durable WAL may wait before the archive has it;
//! `archive_max_backlog` (bytes, 0 = unbounded) how much may wait: past it a primary refuses
//! appends with a retryable error naming the archive and a relay stops reading from its
//! upstream, until the archive catches up. `archive_compression` (`none` or `zstd`) is how
//! objects are stored, `archive_compression_level` zstd's level. All take effect at a restart.

use actix::Addr;
use serde::Deserialize;
use std::time::Instant;

use supervisor_actor::{Fence, Node, SuperviseService};
use tokio::sync::watch;
use wal_archive::{
    ArchiveCommand, ArchiveConfig, ArchiveMode, ArchiveTarget, Archiver, ArchiverStatus,
    Compression, S3Options, StopArchiver,
};

use crate::config::Settings;
use crate::error::{Error, Result};
use crate::failover::Password;

/// Every key of the `[archive]` table, for `-c archive.KEY`, `WALSERVER_ARCHIVE_KEY` and the
/// test that checks the example configs document each one.
pub const ARCHIVE_KEYS: &[&str] = &[
    "endpoint",
    "region",
    "allow_http",
    "access_key_id",
    "secret_access_key",
    "multipart_part_size",
];

/// The `[archive]` table as written: the object store of an `s3://` target.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveSettings {
    /// The S3 service's URL; AWS's endpoint for the region when unset.
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
    /// Allows a plain `http://` endpoint.
    #[serde(default)]
    pub allow_http: bool,
    /// Credentials; `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` when unset.
    #[serde(default)]
    pub access_key_id: Option<String>,
    #[serde(default)]
    pub secret_access_key: Option<Password>,
    /// Objects larger than this go as multipart uploads of parts this size (at least 5 MiB,
    /// S3's minimum); 8 MiB when unset. Bare numbers are bytes.
    #[serde(default, deserialize_with = "crate::units::some_size_bytes")]
    pub multipart_part_size: Option<u64>,
}

impl ArchiveSettings {
    /// The object store's options, credentials from the table, else from `env` (the
    /// standard AWS variables): both keys from one place, never one from each.
    pub fn s3_options(&self, env: impl Fn(&str) -> Option<String>) -> S3Options {
        let (access_key_id, secret_access_key, session_token) =
            match (&self.access_key_id, &self.secret_access_key) {
                (Some(id), Some(secret)) => (Some(id.clone()), Some(secret.0.clone()), None),
                (None, None) => (
                    env("AWS_ACCESS_KEY_ID"),
                    env("AWS_SECRET_ACCESS_KEY"),
                    env("AWS_SESSION_TOKEN"),
                ),
                // Half a pair is a mistake the target's parse reports as missing credentials.
                _ => (None, None, None),
            };
        S3Options {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            allow_http: self.allow_http,
            access_key_id,
            secret_access_key,
            session_token,
            multipart_part_size: self.multipart_part_size,
        }
    }
}

/// The archiver's configuration the settings give; `None` with `archive_mode = off`.
pub fn archive_config(s: &Settings) -> Result<Option<ArchiveConfig>> {
    let mode = match s.archive_mode.as_str() {
        "off" => return Ok(None),
        "on" => ArchiveMode::On,
        "always" => ArchiveMode::Always,
        other => {
            return Err(Error::Invalid(format!(
                "archive_mode must be off, on or always, not {other:?}"
            )))
        }
    };
    let target = match (s.archive_target.as_deref(), s.archive_command.as_deref()) {
        (Some(_), None) => archive_target(s)?,
        (None, Some(command)) if !command.trim().is_empty() => {
            // A command cannot be listed, so superseded prefixes could never be removed;
            // PostgreSQL's answer to archive_timeout there is a segment switch, which
            // walserver's WAL has no place for.
            if !s.archive_timeout.is_zero() {
                return Err(Error::Invalid(
                    "archive_timeout needs archive_target: an archive_command cannot remove the prefixes it supersedes".into(),
                ));
            }
            ArchiveTarget::Command(ArchiveCommand {
                command: command.to_string(),
                staging: s.data_dir.join("archive_staging"),
            })
        }
        (Some(_), Some(_)) => {
            return Err(Error::Invalid(
                "set archive_target or archive_command, not both".into(),
            ))
        }
        _ => {
            return Err(Error::Invalid(format!(
                "archive_mode = {} needs archive_target (file:///path) or archive_command",
                s.archive_mode
            )))
        }
    };
    let compression = Compression::parse(&s.archive_compression, s.archive_compression_level)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    Ok(Some(ArchiveConfig {
        mode,
        target,
        archive_timeout: s.archive_timeout,
        max_backlog: s.archive_max_backlog,
        compression,
    }))
}

/// The archive `archive_target` names, whatever `archive_mode` says: restore reads an archive
/// that the reading host does not archive to.
pub fn archive_target(s: &Settings) -> Result<ArchiveTarget> {
    let target = s.archive_target.as_deref().ok_or_else(|| {
        Error::Invalid(
            "no archive_target: set it in the configuration (file:///path or s3://bucket/prefix) or pass -c archive_target=URL"
                .into(),
        )
    })?;
    let options = s
        .archive
        .clone()
        .unwrap_or_default()
        .s3_options(|name| std::env::var(name).ok());
    ArchiveTarget::parse_with(target, &options).map_err(|e| Error::Invalid(e.to_string()))
}

/// The archive a walreceiver fills a gap from, `None` without `archive_target`: a standby
/// reads the archive it names whatever `archive_mode` says, and so does a member under
/// `[failover]` following a new leader that has removed WAL the member still needs.
pub fn gap_archive(s: &Settings) -> Result<Option<ArchiveTarget>> {
    s.archive_target
        .is_some()
        .then(|| archive_target(s))
        .transpose()
}

/// Starts the archiver the settings describe beside `node`, in the current actix System, and
/// hands it to the node's supervisor, which stops it in the node's shutdown order (its upload
/// in flight finishes first). Returns its address and status. With `archive_mode = off` it
/// starts nothing and ends an earlier archiver's hold on the node's WAL, so that WAL nobody
/// archives is not kept for ever (PostgreSQL ignores `.ready` files then).
pub fn start_archiver(
    settings: &Settings,
    node: &Node,
) -> Result<Option<(Addr<Archiver>, watch::Receiver<ArchiverStatus>)>> {
    let Some(config) = archive_config(settings)? else {
        let wal = node.wal.clone();
        // A file removal and a directory fsync: off the actor threads, and nothing waits for
        // it (until it is done the hold only keeps WAL a little longer).
        actix::spawn(async move {
            let released = tokio::task::spawn_blocking(move || wal.release_archive_hold()).await;
            if let Ok(Err(e)) = released {
                tracing::warn!(error = %e, "could not end the archive's hold on WAL");
            }
        });
        return Ok(None);
    };
    let target = match &config.target {
        ArchiveTarget::Command(_) => "archive_command".to_string(),
        t => t.describe(""),
    };
    tracing::info!(mode = %settings.archive_mode, %target, "starting the WAL archiver");
    let fence = node
        .fence
        .is_managed()
        .then(|| leader_fence(node.fence.clone()));
    let (addr, status) = Archiver::start_fenced(node.wal.clone(), config, fence);
    let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
    let archiver = addr.clone();
    node.supervisor.do_send(SuperviseService {
        name: "archiver".into(),
        // The archiver does not end by itself; its end is its stop.
        ended: Box::pin(async move {
            let _ = stopped_rx.await;
            Ok(())
        }),
        stop: Box::new(move || {
            Box::pin(async move {
                let _ = archiver.send(StopArchiver).await;
                let _ = stopped_tx.send(());
            })
        }),
    });
    Ok(Some((addr, status)))
}

/// Whether `fence` lets this node act as the leader, as a watch that changes only when that
/// does: at a grant, a revocation, a new term, or the grant's deadline passing (the fence's
/// own `next_change`, so nothing is polled). It ends when every receiver is gone.
fn leader_fence(fence: Fence) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(fence.may_acknowledge(Instant::now()));
    actix::spawn(async move {
        loop {
            // Armed before the fence is read, so that no change in between is missed.
            let next = fence.next_change();
            let held = fence.may_acknowledge(Instant::now());
            tx.send_if_modified(|was| std::mem::replace(was, held) != held);
            tokio::select! {
                _ = next => {}
                _ = tx.closed() => return,
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::load;
    use crate::config::Sources;

    #[test]
    fn archive_mode_and_target_give_the_archiver_s_configuration() {
        let base = "data_dir = \"/d\"";
        let s = load(base, &[], &[]).unwrap();
        assert_eq!(s.archive_mode, "off");
        assert!(archive_config(&s).unwrap().is_none());
        let s = load(
            base,
            &[
                ("WALSERVER_ARCHIVE_MODE", "always"),
                ("WALSERVER_ARCHIVE_TARGET", "file:///a"),
                ("WALSERVER_ARCHIVE_TIMEOUT", "60"),
                ("WALSERVER_ARCHIVE_MAX_BACKLOG", "64MB"),
            ],
            &[],
        )
        .unwrap();
        let c = archive_config(&s).unwrap().unwrap();
        assert_eq!(c.mode, ArchiveMode::Always);
        assert_eq!(c.archive_timeout, std::time::Duration::from_secs(60));
        assert_eq!(c.max_backlog, 64 << 20);
        assert_eq!(c.target, ArchiveTarget::Directory("/a".into()));
        let s = load(
            base,
            &[],
            &[("archive_mode", "on"), ("archive_target", "file:///b")],
        )
        .unwrap();
        assert_eq!(archive_config(&s).unwrap().unwrap().mode, ArchiveMode::On);
        let s = load(
            base,
            &[],
            &[("archive_mode", "on"), ("archive_command", "cp %p /a/%f")],
        )
        .unwrap();
        assert_eq!(
            archive_config(&s).unwrap().unwrap().target,
            ArchiveTarget::Command(ArchiveCommand {
                command: "cp %p /a/%f".into(),
                staging: "/d/archive_staging".into(),
            })
        );
        // Refused at load, with the key named.
        for (overrides, needle) in [
            (
                vec![
                    ("archive_mode", "on"),
                    ("archive_command", "cp %p /a/%f"),
                    ("archive_target", "file:///b"),
                ],
                "archive_command",
            ),
            (
                vec![
                    ("archive_mode", "on"),
                    ("archive_command", "cp %p /a/%f"),
                    ("archive_timeout", "60"),
                ],
                "archive_timeout",
            ),
            (vec![("archive_mode", "on")], "archive_target"),
            (vec![("archive_mode", "yes")], "archive_mode"),
            (
                vec![("archive_mode", "on"), ("archive_target", "gs://bucket/p")],
                "archive_target",
            ),
            (
                vec![
                    ("archive_mode", "on"),
                    ("archive_target", "file:///b"),
                    ("archive_compression", "lz4"),
                ],
                "archive_compression",
            ),
        ] {
            let e = format!("{:#}", load(base, &[], &overrides).unwrap_err());
            assert!(e.contains(needle), "{overrides:?}: {e}");
        }
    }

    #[test]
    fn archive_compression_level_is_zstd_s_level_checked_at_load() {
        let base = "data_dir = \"/d\"\narchive_mode = \"on\"\narchive_target = \"file:///a\"\narchive_compression = \"zstd\"\n";
        let compression = |file: &str, env: &[(&str, &str)], c: &[(&str, &str)]| {
            archive_config(&load(file, env, c).unwrap())
                .unwrap()
                .unwrap()
                .compression
        };
        assert_eq!(compression(base, &[], &[]), Compression::DEFAULT_ZSTD);
        let file = format!("{base}archive_compression_level = -3\n");
        assert_eq!(
            compression(&file, &[], &[]),
            Compression::Zstd { level: -3 }
        );
        let env = [("WALSERVER_ARCHIVE_COMPRESSION_LEVEL", "-2")];
        assert_eq!(
            compression(base, &env, &[]),
            Compression::Zstd { level: -2 }
        );
        let c = [("archive_compression_level", "19")];
        assert_eq!(
            compression(&file, &env, &c),
            Compression::Zstd { level: 19 }
        );
        // Out of range, not a number, or given to `none`: refused at load, with the key named.
        for overrides in [
            vec![("archive_compression_level", "23")],
            vec![("archive_compression_level", "-8")],
            vec![("archive_compression_level", "fast")],
            vec![
                ("archive_compression", "none"),
                ("archive_compression_level", "1"),
            ],
        ] {
            let e = load(base, &[], &overrides)
                .and_then(|s| Ok(archive_config(&s)?))
                .map(|c| c.map(|c| c.compression))
                .unwrap_err();
            let e = format!("{e:#}");
            assert!(
                e.contains("archive_compression_level"),
                "{overrides:?}: {e}"
            );
        }
    }

    #[test]
    fn a_reader_of_the_archive_needs_a_target_but_no_data_directory() {
        let sources = |overrides: &[(&str, &str)]| Sources {
            file: None,
            overrides: overrides
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            env: Some(Default::default()),
        };
        let s =
            Settings::load_without_data_dir(&sources(&[("archive_target", "file:///r")])).unwrap();
        assert_eq!(
            archive_target(&s).unwrap(),
            ArchiveTarget::Directory("/r".into())
        );
        // archive_mode = off (the default) still names the archive to read.
        assert_eq!(s.archive_mode, "off");
        let s = Settings::load_without_data_dir(&sources(&[])).unwrap();
        let e = archive_target(&s).unwrap_err().to_string();
        assert!(e.contains("no archive_target"), "{e}");
        // A node's own settings still need their data directory.
        assert!(matches!(
            Settings::load(&sources(&[("archive_target", "file:///r")])),
            Err(Error::MissingDataDir { .. })
        ));
    }

    #[test]
    fn an_s3_target_takes_the_archive_table_from_the_file_the_environment_and_c() {
        let file = r#"data_dir = "/d"
archive_mode = "on"
archive_target = "s3://wal/main"
archive_compression = "zstd"
[archive]
endpoint = "http://127.0.0.1:8333"
allow_http = true
access_key_id = "k"
secret_access_key = "s"
multipart_part_size = "16MB"
"#;
        let s = load(file, &[("WALSERVER_ARCHIVE_REGION", "eu-west-1")], &[]).unwrap();
        let c = archive_config(&s).unwrap().unwrap();
        assert_eq!(c.compression, Compression::DEFAULT_ZSTD);
        let ArchiveTarget::S3(t) = &c.target else {
            panic!("{:?}", c.target)
        };
        assert_eq!(t.url_of("x"), "s3://wal/main/x");
        let want = S3Options {
            endpoint: Some("http://127.0.0.1:8333".into()),
            region: Some("eu-west-1".into()),
            allow_http: true,
            access_key_id: Some("k".into()),
            secret_access_key: Some("s".into()),
            session_token: None,
            multipart_part_size: Some(16 << 20),
        };
        assert_eq!(s.archive.as_ref().unwrap().s3_options(|_| None), want);
        // The secret stays out of every debug dump.
        assert!(!format!("{s:?} {c:?}").contains("\"s\""));
        // -c overrides a key; allow_http off refuses the http:// endpoint.
        let e = load(file, &[], &[("archive.allow_http", "false")]).unwrap_err();
        assert!(format!("{e:#}").contains("allow_http"), "{e:#}");
        assert!(load(file, &[], &[("archive.nonsense", "1")]).is_err());
        let e = load(file, &[("WALSERVER_ARCHIVE", "x")], &[]).unwrap_err();
        assert!(e.to_string().contains("[archive] is a table"), "{e}");
        let e = load(file, &[("WALSERVER_ARCHIVE_ENDPIONT", "x")], &[]).unwrap_err();
        assert!(e.to_string().contains("WALSERVER_ARCHIVE_ENDPOINT"), "{e}");
    }

    #[test]
    fn credentials_come_from_the_table_else_the_aws_variables_as_a_pair() {
        let env = |name: &str| match name {
            "AWS_ACCESS_KEY_ID" => Some("env-k".to_string()),
            "AWS_SECRET_ACCESS_KEY" => Some("env-s".to_string()),
            "AWS_SESSION_TOKEN" => Some("env-t".to_string()),
            _ => None,
        };
        let o = ArchiveSettings::default().s3_options(env);
        assert_eq!(
            (o.access_key_id, o.secret_access_key, o.session_token),
            (
                Some("env-k".into()),
                Some("env-s".into()),
                Some("env-t".into())
            )
        );
        let table = ArchiveSettings {
            access_key_id: Some("k".into()),
            secret_access_key: Some(Password("s".into())),
            ..ArchiveSettings::default()
        };
        let o = table.s3_options(env);
        assert_eq!(
            (o.access_key_id, o.secret_access_key, o.session_token),
            (Some("k".into()), Some("s".into()), None)
        );
        // Half a pair in the table is not completed from the environment.
        let half = ArchiveSettings {
            access_key_id: Some("k".into()),
            ..ArchiveSettings::default()
        };
        let o = half.s3_options(env);
        assert_eq!((&o.access_key_id, &o.secret_access_key), (&None, &None));
        assert!(ArchiveTarget::parse_with("s3://b/p", &o)
            .unwrap_err()
            .to_string()
            .contains("credentials"));
    }
}
