//! What the actors log, read back through a tracing subscriber of the test's own: state
//! changes logged once, with no Rust debug text.

use std::io::Write;
use std::sync::{Arc, Mutex};

use crate::harness::*;

/// Every line the actors of this thread log, and a signal at each.
#[derive(Clone, Default)]
struct Lines {
    text: Arc<Mutex<Vec<u8>>>,
    written: Arc<tokio::sync::Notify>,
}

impl Lines {
    fn count(&self, what: &str) -> usize {
        let text = self.text.lock().map(|t| t.clone()).unwrap_or_default();
        String::from_utf8_lossy(&text).matches(what).count()
    }

    /// Waits until `what` has been logged `n` times, at most `within`.
    async fn wait_count(&self, what: &str, n: usize, within: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let written = self.written.notified();
            if self.count(what) >= n {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, written).await.is_err() {
                bail!(
                    "{what:?} logged {} times, not {n}, within {within:?}",
                    self.count(what)
                );
            }
        }
    }
}

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut text) = self.text.lock() {
            text.extend_from_slice(buf);
        }
        self.written.notify_waiters();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The failover actors' log on this thread (the actix System's), until the guard drops.
fn capture() -> (Lines, tracing::subscriber::DefaultGuard) {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("failover_actor=info")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (lines, tracing::subscriber::set_default(subscriber))
}

/// A pause and a resume are each logged once by every member.
#[test]
fn pause_and_resume_are_logged_once_by_each_member() -> Result<()> {
    let (lines, _guard) = capture();
    with_cluster(|setup| async move {
        let Setup {
            a,
            b,
            c,
            etcd: _etcd,
            dir: _dir,
            term: _term,
        } = setup;
        const PAUSED: &str = "the cluster is paused";
        const RESUMED: &str = "the cluster is resumed";
        b.actor.send(Pause).await??;
        lines.wait_count(PAUSED, 3, TTL).await?;
        c.actor.send(Resume).await??;
        lines.wait_count(RESUMED, 3, TTL).await?;
        // A second pause: by the time every member has seen it, each has said the first
        // pause and the resume once.
        a.actor.send(Pause).await??;
        lines.wait_count(PAUSED, 6, TTL).await?;
        assert_eq!(lines.count(PAUSED), 6);
        assert_eq!(lines.count(RESUMED), 3);
        for debug_text in ["Some(", "Lsn(", "[\""] {
            assert_eq!(lines.count(debug_text), 0, "{debug_text}");
        }
        // A stop that releases the lease says so once per member.
        shutdown([a, b, c]).await;
        assert_eq!(lines.count("released the lease"), 3);
        Ok(())
    })
}

/// A switchover that happens is logged at INFO by the old leader, and no WARN says it did not.
#[test]
fn a_switchover_is_logged_at_info() -> Result<()> {
    let (lines, _guard) = capture();
    with_cluster(|setup| async move {
        let Setup {
            a,
            b,
            c,
            etcd: _etcd,
            dir: _dir,
            term: _term,
        } = setup;
        // Asked of a standby: it goes to the leader through etcd.
        let report = c
            .actor
            .send(Switchover {
                candidate: Some("b".into()),
            })
            .await??;
        assert_eq!(report.new_leader, "b");
        lines
            .wait_count(
                "INFO failover_actor::handover: failover: handed over the leader key",
                1,
                SETTLE,
            )
            .await?;
        assert_eq!(lines.count("did not happen"), 0);
        assert_eq!(lines.count(" WARN "), 0);
        shutdown([a, b, c]).await;
        Ok(())
    })
}
