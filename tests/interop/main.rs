//! Interop tests: real PostgreSQL 15 client programs (pg_receivewal, psql, libpq) against a
//! walserver primary. They fail, never skip, when PostgreSQL 15 is missing.

#[path = "../common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use pg_testkit::PgBin;
use protocol_codec::auth::make_scram_verifier;
use wal_storage::{segment_file_name, Lsn, TimelineId, Wal};

/// pg_receivewal run against a node, in a directory of its own, with its log beside that
/// directory. It is killed when dropped, and a failing test prints its log, because the
/// temporary directory holding the log is gone by the time anyone could read it.
struct Receiver {
    bin: PgBin,
    port: u16,
    root: tempfile::TempDir,
    args: Vec<String>,
    child: Option<Child>,
}

impl Receiver {
    /// A receiver that will stream with `args` (beyond the connection options).
    fn new(bin: &PgBin, node: &TestNode, args: &[&str]) -> Receiver {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("wal")).unwrap();
        Receiver {
            bin: bin.clone(),
            port: node.addr().port(),
            root,
            args: args.iter().map(|a| a.to_string()).collect(),
            child: None,
        }
    }

    fn dir(&self) -> PathBuf {
        self.root.path().join("wal")
    }

    fn log(&self) -> PathBuf {
        self.root.path().join("pg_receivewal.log")
    }

    /// pg_receivewal with the connection options; `--no-loop` makes any error end it at once
    /// instead of retrying after five seconds, so a failure shows in its log, not as a hang.
    fn command(&self) -> Command {
        let mut c = Command::new(self.bin.tool("pg_receivewal"));
        c.args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "repl", "--no-password", "--no-loop", "--verbose"])
            .arg("-D")
            .arg(self.dir());
        c
    }

    /// Runs pg_receivewal once with `args` to completion (`--create-slot`, say).
    fn run_once(&self, args: &[&str]) {
        let out = self.command().args(args).output().unwrap();
        assert!(
            out.status.success(),
            "pg_receivewal {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn start(&mut self) {
        assert!(self.child.is_none(), "pg_receivewal is already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .unwrap();
        let child = self
            .command()
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start pg_receivewal");
        self.child = Some(child);
    }

    /// Waits until pg_receivewal has completed segment `segno` (the file lost its .partial).
    fn wait_for_segment(&self, segno: u64, seg: u64) {
        let path = self
            .dir()
            .join(segment_file_name(TimelineId(1), segno, seg));
        wait_until(
            &format!("pg_receivewal to complete {}", path.display()),
            || path.exists(),
        );
    }

    /// Ends pg_receivewal with SIGKILL, as a crash would (PostgreSQL's documentation stops it
    /// with SIGINT, the clean way), but never while it zero-fills a new segment file. pg_receivewal creates each segment as a .partial file and pads it to the
    /// full segment size before writing WAL into it; killed in between, it leaves a .partial
    /// file that is neither empty nor full, and a restarted pg_receivewal refuses it ("has N
    /// bytes, should be 0 or S") and cannot resume at all. That is pg_receivewal's own
    /// limitation, which says nothing about the server, so the kill is timed around it: the
    /// process is frozen with SIGSTOP, its files are looked at (frozen, they cannot change),
    /// and it is killed only if no .partial file is short; otherwise it is let go on until
    /// its padding is done, and tried again. Everything else a SIGKILL can leave (a full
    /// .partial file with WAL written part of the way) pg_receivewal resumes from by
    /// streaming that segment again from its start.
    fn kill_hard(&mut self, seg: u64) {
        let mut child = self.child.take().expect("pg_receivewal is running");
        let pid = child.id() as libc::pid_t;
        loop {
            // SAFETY: kill(2) and waitpid(2) on our own child, which has not been reaped.
            let stopped = unsafe {
                libc::kill(pid, libc::SIGSTOP);
                let mut status = 0;
                libc::waitpid(pid, &mut status, libc::WUNTRACED) == pid && libc::WIFSTOPPED(status)
            };
            assert!(
                stopped,
                "pg_receivewal ended before it could be killed; its log:\n{}",
                self.log_text()
            );
            if self.short_partials(seg).is_empty() {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                break;
            }
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
            wait_until("pg_receivewal to finish padding a segment file", || {
                self.short_partials(seg).is_empty()
            });
        }
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    }

    /// .partial files that are neither empty nor a whole segment.
    fn short_partials(&self, seg: u64) -> Vec<String> {
        std::fs::read_dir(self.dir())
            .unwrap()
            .filter_map(|e| {
                let e = e.ok()?;
                let name = e.file_name().into_string().ok()?;
                let len = e.metadata().ok()?.len();
                (name.ends_with(".partial") && len != 0 && len != seg).then_some(name)
            })
            .collect()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("pg_receivewal's log:\n{}", self.log_text());
        }
    }
}

/// Every completed segment pg_receivewal wrote is byte-identical to walserver's.
fn compare_segments(node: &TestNode, dir: &Path) -> usize {
    let mut compared = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.len() != 24 || name.ends_with(".partial") {
            continue;
        }
        let theirs = read_file(&dir.join(&name));
        let ours = read_file(&node.data_dir().join("pg_wal").join(&name));
        assert!(
            theirs == ours,
            "segment {name} differs between pg_receivewal and walserver"
        );
        compared += 1;
    }
    compared
}

/// Appends one MiB (8 records of 128 KiB) and waits until it is durable.
fn append_one_mib(wal: &Wal, seed: u8) -> Lsn {
    let payloads = (0..8)
        .map(|i| bytes::Bytes::from(vec![seed.wrapping_add(i); 128 << 10]))
        .collect();
    let ends = wal.append(payloads).unwrap().wait().unwrap();
    *ends.last().unwrap()
}

/// An appender on its own thread: one MiB at a time until it is told to stop and its WAL
/// reaches `target`. It also stops at a cap, so a test that fails while it runs does not fill
/// the disk.
struct Appender {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Lsn>>,
}

impl Appender {
    fn start(wal: Wal, target: Lsn) -> Appender {
        const CAP_MIB: usize = 512;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut end = wal.flushed();
            for i in 0..CAP_MIB {
                if end >= target && flag.load(Ordering::Relaxed) {
                    break;
                }
                end = append_one_mib(&wal, i as u8);
            }
            end
        });
        Appender {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the appends and returns the end of the last one.
    fn finish(mut self) -> Lsn {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().expect("appender")
    }
}

impl Drop for Appender {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The ways operators run pg_receivewal, each tested through a SIGKILL.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ReceiveMode {
    /// No slot: the server keeps WAL for it through `wal_keep_size`.
    Plain,
    /// `--create-slot --slot S` once, then streaming with `--slot S`: the slot keeps its WAL.
    Slot,
    /// `--slot S --synchronous`: it fsyncs what it writes at once and reports it as flushed.
    Synchronous,
}

const SLOT: &str = "recv1";

/// pg_receivewal in `mode` streams at least 64 MiB of `seg`-byte segments while records are
/// appended, is killed with SIGKILL part of the way and restarted, and ends with every segment
/// from the first it streamed to the last completed, each byte-identical to walserver's: it
/// resumed with no gap.
fn pg_receivewal_streams_and_resumes_after_sigkill(mode: ReceiveMode, seg: u64) {
    const STREAM: u64 = 64 << 20;
    let bin = PgBin::require();
    // The server keeps every segment, so that all of pg_receivewal's can be compared with
    // its own at the end; a slot would let go of those pg_receivewal has flushed.
    let node = TestNode::primary_with_segments(seg, "wal_keep_size = \"1GB\"");
    // Some WAL before it starts, so that it starts inside the WAL, not at its beginning.
    for i in 0..2 {
        append_one_mib(node.wal(), i);
    }
    let mut args = vec![];
    if mode != ReceiveMode::Plain {
        args.extend(["--slot", SLOT]);
    }
    if mode == ReceiveMode::Synchronous {
        args.push("--synchronous");
    }
    let mut recv = Receiver::new(&bin, &node, &args);
    if mode != ReceiveMode::Plain {
        recv.run_once(&["--create-slot", "--slot", SLOT]);
        assert_eq!(node.http_get("/slots")[0]["slot_name"], SLOT);
    }
    // pg_receivewal starts at the beginning of the segment holding the server's end of WAL.
    let first = node.wal().flushed().segment_number(seg);
    recv.start();
    let slot_holds_wal = || node.http_get("/slots")[0]["restart_lsn"].is_string();
    match mode {
        ReceiveMode::Plain => wait_until("pg_receivewal to stream", || {
            node.http_get("/status")["replication"][0]["state"] == "streaming"
        }),
        // Its first status report makes the slot hold WAL from where it started.
        ReceiveMode::Slot | ReceiveMode::Synchronous => {
            wait_until("the slot to hold WAL", slot_holds_wal)
        }
    }
    // Enough that the completed segments from the first hold at least 64 MiB.
    let appender = Appender::start(node.wal().clone(), Lsn(first * seg + STREAM));
    let per_16_mib = (16 << 20) / seg;
    recv.wait_for_segment(first + per_16_mib, seg);
    // Killed while records are appended, and restarted at once.
    recv.kill_hard(seg);
    if mode != ReceiveMode::Plain {
        // The walsender of the killed process lets go of the slot once it sees the connection
        // close; a new pg_receivewal that came sooner would be refused with "slot is active".
        wait_until("the slot to be released", || {
            node.http_get("/slots")[0]["active"] == false
        });
    }
    recv.start();
    // The appends go on until the restarted pg_receivewal has streamed another 16 MiB.
    recv.wait_for_segment(first + 2 * per_16_mib, seg);
    if mode != ReceiveMode::Plain {
        assert_eq!(
            node.http_get("/status")["replication"][0]["slot_name"],
            SLOT
        );
    }
    let end = appender.finish();
    let last = end.segment_number(seg) - 1;
    recv.wait_for_segment(last, seg);
    if mode == ReceiveMode::Synchronous {
        // It reports its fsynced position as flush, and the slot follows it.
        wait_until("pg_receivewal to report flush", || {
            node.http_get("/status")["replication"][0]["flush_lsn"]
                == serde_json::json!(end.to_string())
        });
        wait_until("the slot to advance", || {
            node.http_get("/slots")[0]["restart_lsn"] == serde_json::json!(end.to_string())
        });
    }
    recv.kill_hard(seg);
    // Every segment from the first to the last completed one is there, and equal: no gap.
    let listing: Vec<_> = std::fs::read_dir(recv.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    for segno in first..=last {
        let name = segment_file_name(TimelineId(1), segno, seg);
        assert!(
            recv.dir().join(&name).exists(),
            "pg_receivewal has no {name}: {listing:?}"
        );
    }
    assert!(
        (last + 1 - first) * seg >= STREAM,
        "streamed only segments {first}..={last}"
    );
    let compared = compare_segments(&node, &recv.dir());
    assert_eq!(compared as u64, last + 1 - first, "{listing:?}");
}

/// PostgreSQL's default 16 MiB segments, no slot.
#[test]
fn pg_receivewal_streams_identical_segments_and_resumes_after_sigkill() {
    pg_receivewal_streams_and_resumes_after_sigkill(ReceiveMode::Plain, 16 << 20);
}

#[test]
fn pg_receivewal_with_a_created_slot_streams_identical_segments_and_resumes_after_sigkill() {
    pg_receivewal_streams_and_resumes_after_sigkill(ReceiveMode::Slot, 1 << 20);
}

#[test]
fn pg_receivewal_synchronous_reports_flush_and_resumes_after_sigkill() {
    pg_receivewal_streams_and_resumes_after_sigkill(ReceiveMode::Synchronous, 2 << 20);
}

fn psql(
    bin: &PgBin,
    node: &TestNode,
    user: &str,
    password: Option<&str>,
    sql: &str,
) -> std::process::Output {
    let mut c = Command::new(bin.tool("psql"));
    c.arg(format!(
        "host=127.0.0.1 port={} user={user} replication=true",
        node.addr().port()
    ))
    .args(["-X", "-A", "-F", "|", "-c", sql]);
    match password {
        Some(p) => c.env("PGPASSWORD", p),
        None => c.arg("--no-password"),
    };
    c.output().expect("run psql")
}

#[test]
fn psql_gets_postgres_result_shapes() {
    let bin = PgBin::require();
    let node = TestNode::primary("");
    let out = psql(&bin, &node, "u", None, "IDENTIFY_SYSTEM");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("systemid|timeline|xlogpos|dbname"));
    assert_eq!(
        lines.next().map(str::to_string),
        Some(format!(
            "{}|1|{}|",
            node.wal().system_id(),
            node.wal().flushed()
        ))
    );
    let out = psql(&bin, &node, "u", None, "SHOW wal_segment_size");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .take(2)
            .collect::<Vec<_>>(),
        ["wal_segment_size", "1MB"]
    );
    let out = psql(&bin, &node, "u", None, "SHOW server_version");
    assert!(String::from_utf8_lossy(&out.stdout).contains("15.0"));
    let out = psql(&bin, &node, "u", None, "SELECT 1");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("cannot execute SQL commands in WAL sender for physical replication"));
}

#[test]
fn libpq_scram_wrong_password_and_rejected_address() {
    let bin = PgBin::require();
    let verifier = make_scram_verifier("secret");
    let node = TestNode::primary(&format!(
        "[users]\nrepl = \"{verifier}\"\n[[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"outsider\"\nmethod = \"reject\"\n[[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"all\"\nmethod = \"scram-sha-256\"\n"
    ));
    let out = psql(&bin, &node, "repl", Some("secret"), "IDENTIFY_SYSTEM");
    assert!(
        out.status.success(),
        "SCRAM with libpq failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = psql(&bin, &node, "repl", Some("wrong"), "IDENTIFY_SYSTEM");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("password authentication failed for user \"repl\""),
        "{err}"
    );
    let out = psql(&bin, &node, "outsider", Some("secret"), "IDENTIFY_SYSTEM");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "walserver's hba rules reject replication connection for host \"127.0.0.1\", user \"outsider\""
        ),
        "{err}"
    );
    // The SQLSTATEs behind those messages, read with our own client.
    assert_eq!(
        sqlstate(
            &PgConn::connect(node.addr(), "repl", Some("wrong"))
                .err()
                .unwrap()
        ),
        "28P01"
    );
    assert_eq!(
        sqlstate(
            &PgConn::connect(node.addr(), "outsider", Some("x"))
                .err()
                .unwrap()
        ),
        "28000"
    );
}

/// libpq over TLS: the walsender answers SSLRequest with 'S' when it has a certificate, and
/// psql with sslmode=verify-full (and SCRAM inside TLS) runs a command.
#[test]
fn libpq_over_tls_verify_full() {
    let bin = PgBin::require();
    let certs = tempfile::tempdir().unwrap();
    let files = pg_testkit::TestPki::new(&["localhost", "127.0.0.1"]).write_to(certs.path());
    let verifier = make_scram_verifier("secret");
    let node = TestNode::primary(&format!(
        "ssl_cert_file = {:?}\nssl_key_file = {:?}\n[users]\nrepl = \"{verifier}\"\n[[hba]]\ntype = \"hostssl\"\naddress = \"127.0.0.1/32\"\nuser = \"all\"\nmethod = \"scram-sha-256\"\n[[hba]]\ntype = \"hostnossl\"\naddress = \"all\"\nuser = \"all\"\nmethod = \"reject\"\n",
        files.cert.display().to_string(),
        files.key.display().to_string()
    ));
    let run = |sslmode: &str| {
        Command::new(bin.tool("psql"))
            .arg(format!(
                "host=localhost port={} user=repl replication=true sslmode={sslmode} sslrootcert={}",
                node.addr().port(),
                files.root.display()
            ))
            .args(["-X", "-A", "-t", "-c", "IDENTIFY_SYSTEM"])
            .env("PGPASSWORD", "secret")
            .output()
            .unwrap()
    };
    let out = run("verify-full");
    assert!(
        out.status.success(),
        "TLS connection failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(&node.wal().system_id().to_string()));
    // The admin API serves TLS with the same certificate.
    let config = protocol_codec::tls::client_config(
        protocol_codec::tls::SslMode::VerifyFull,
        Some(&files.root),
    )
    .unwrap()
    .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(config, name).unwrap();
    let sock = std::net::TcpStream::connect(node.http_addr).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    use std::io::{Read, Write};
    write!(tls, "GET /status HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = tls.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
    assert!(answer.contains("\"role\":\"primary\""), "{answer}");
    // Without TLS the rules refuse it.
    let out = run("disable");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("walserver's hba rules reject"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An ErrorResponse as the side-by-side tests compare it: severity, SQLSTATE and text.
fn error_line(f: &protocol_codec::ErrorFields) -> String {
    format!(
        "{} {} {}",
        f.get(b'S').unwrap_or("?"),
        f.get(b'C').unwrap_or("?"),
        f.get(b'M').unwrap_or("?")
    )
}

/// What a server answers, in the streaming sub-protocol, to what `act` does right after
/// START_REPLICATION at its current end: every message but WAL and keepalives (an error as its
/// severity, SQLSTATE and text), up to ReadyForQuery, or `closed` when the server closes.
fn copy_answer(addr: SocketAddr, user: &str, act: &dyn Fn(&mut PgConn)) -> Vec<String> {
    use protocol_codec::BackendMessage;
    let mut c = PgConn::connect(addr, user, None).expect("connect");
    let start = c.client.identify_system().expect("IDENTIFY_SYSTEM").xlogpos;
    c.start_replication(start);
    act(&mut c);
    answers(&mut c, &|m| match m {
        BackendMessage::XLogData(_) | BackendMessage::PrimaryKeepalive(_) => None,
        BackendMessage::ErrorResponse(f) => Some(error_line(f)),
        m => Some(format!("{m:?}")),
    })
}

/// What a server sends until ReadyForQuery (included) or its close (`closed`), each message
/// as `name` names it, those it names `None` left out.
fn answers(
    c: &mut PgConn,
    name: &dyn Fn(&protocol_codec::BackendMessage) -> Option<String>,
) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        match c.try_recv() {
            Ok(m) => {
                out.extend(name(&m));
                if matches!(m, protocol_codec::BackendMessage::ReadyForQuery(_)) {
                    return out;
                }
            }
            Err(_) => {
                assert!(c.closed(), "neither a message nor the close: {out:?}");
                out.push("closed".into());
                return out;
            }
        }
    }
}

/// The streaming sub-protocol, walserver against a real PostgreSQL 15: the same client actions
/// right after START_REPLICATION get the same answers (CopyDone at once, after a status update
/// or after hot-standby feedback; a query, a CopyFail, or a Terminate in the middle of the
/// copy), and a status update asking for a reply gets a keepalive from both.
#[test]
fn the_streaming_sub_protocol_answers_as_postgresql_15_does() {
    use protocol_codec::messages::{HotStandbyFeedback, PrimaryKeepalive, StandbyStatusUpdate};
    use protocol_codec::{BackendMessage, FrontendMessage};
    use wal_types::PgTimestamp;

    let pg = pg_testkit::PgCluster::init_primary(&pg_testkit::PgOptions::default());
    let node = TestNode::primary("");
    let status = |reply_requested| {
        FrontendMessage::StandbyStatusUpdate(StandbyStatusUpdate {
            write: Lsn::INVALID,
            flush: Lsn::INVALID,
            apply: Lsn::INVALID,
            send_time: PgTimestamp::now(),
            reply_requested,
        })
    };
    let feedback = FrontendMessage::HotStandbyFeedback(HotStandbyFeedback {
        send_time: PgTimestamp::now(),
        xmin: 0,
        xmin_epoch: 0,
        catalog_xmin: 0,
        catalog_xmin_epoch: 0,
    });
    type Act = Box<dyn Fn(&mut PgConn)>;
    let cases: Vec<(&str, Act)> = vec![
        ("CopyDone", Box::new(|c| c.send(FrontendMessage::CopyDone))),
        (
            "a status update, then CopyDone",
            Box::new(move |c| {
                c.send(status(false));
                c.send(FrontendMessage::CopyDone);
            }),
        ),
        (
            "hot-standby feedback, then CopyDone",
            Box::new(move |c| {
                c.send(feedback.clone());
                c.send(FrontendMessage::CopyDone);
            }),
        ),
        (
            "a status update asking for a reply: a keepalive, then CopyDone",
            Box::new(move |c| {
                c.send(status(true));
                loop {
                    match c.recv() {
                        BackendMessage::PrimaryKeepalive(PrimaryKeepalive { .. }) => break,
                        BackendMessage::XLogData(_) => {}
                        other => panic!("before the keepalive: {other:?}"),
                    }
                }
                c.send(FrontendMessage::CopyDone);
            }),
        ),
        (
            "a query during the copy",
            Box::new(|c| c.send(FrontendMessage::Query("IDENTIFY_SYSTEM".into()))),
        ),
        (
            "CopyFail",
            Box::new(|c| c.send(FrontendMessage::CopyFail("giving up".into()))),
        ),
        (
            "Terminate",
            Box::new(|c| c.send(FrontendMessage::Terminate)),
        ),
    ];
    for (what, act) in &cases {
        let theirs = copy_answer(pg.addr(), "postgres", act.as_ref());
        let ours = copy_answer(node.addr(), "u", act.as_ref());
        eprintln!("{what}: {theirs:?}");
        assert_eq!(ours, theirs, "{what}: walserver against PostgreSQL 15");
    }
}

/// The startup phase's refusals, walserver against a real PostgreSQL 15: the same bytes get
/// the same FATAL (severity, SQLSTATE and text), then the close. A StartupMessage of protocol
/// 4.0; eight bytes of a code that is no request and no version 3; a second SSLRequest after
/// the first was answered `N`. (A packet of an impossible length differs on purpose:
/// PostgreSQL closes without a word, walserver says why first.)
#[test]
fn the_startup_phase_refuses_as_postgresql_15_does() {
    use protocol_codec::{BackendMessage, StartupPacket};

    let pg = pg_testkit::PgCluster::init_primary(&pg_testkit::PgOptions::default());
    let node = TestNode::primary("");
    let encode = |p: StartupPacket| {
        let mut b = bytes::BytesMut::new();
        p.encode(&mut b).expect("encodes");
        b.to_vec()
    };
    let v4 = encode(StartupPacket::Startup {
        protocol: (4, 0),
        params: vec![
            ("user".into(), "postgres".into()),
            ("replication".into(), "true".into()),
        ],
    });
    let ssl_request = encode(StartupPacket::SslRequest);
    let maybe = encode(StartupPacket::startup([
        ("user", "postgres"),
        ("replication", "maybe"),
    ]));
    let cases: [(&str, Vec<Vec<u8>>); 4] = [
        ("a StartupMessage of protocol 4.0", vec![v4]),
        (
            "eight bytes of no known code",
            vec![vec![0, 0, 0, 8, 0x00, 0xbc, 0x61, 0x4e]],
        ),
        (
            "a second SSLRequest",
            vec![ssl_request.clone(), ssl_request],
        ),
        ("replication=maybe", vec![maybe]),
    ];
    let answer = |addr: SocketAddr, sends: &[Vec<u8>]| -> (String, bool) {
        let mut c = PgConn::raw(addr);
        for (i, bytes) in sends.iter().enumerate() {
            c.send_raw(bytes);
            if i + 1 < sends.len() {
                // An SSLRequest's answer is one byte, outside the message framing.
                let mut b = [0u8; 1];
                std::io::Read::read_exact(&mut c.stream, &mut b).expect("the SSL answer");
                assert_eq!(b[0], b'N', "no TLS on either server");
            }
        }
        let m = c.recv();
        let BackendMessage::ErrorResponse(f) = &m else {
            panic!("not an error: {m:?}")
        };
        (error_line(f), c.closed())
    };
    for (what, sends) in &cases {
        let theirs = answer(pg.addr(), sends);
        let ours = answer(node.addr(), sends);
        eprintln!("{what}: {theirs:?}");
        assert!(theirs.1, "{what}: PostgreSQL closed the connection");
        assert_eq!(ours, theirs, "{what}: walserver against PostgreSQL 15");
    }
}

/// How a server ends an authentication that asked for SCRAM: every message after the
/// client's last step (see [`auth_end`]).
fn auth_answer(addr: SocketAddr, user: &str, act: &dyn Fn(&mut PgConn)) -> Vec<String> {
    use protocol_codec::{AuthRequest, BackendMessage};
    let mut c = auth_start(addr, user);
    match c.recv() {
        BackendMessage::Authentication(AuthRequest::Sasl { .. }) => {}
        other => panic!("not a SASL request: {other:?}"),
    }
    act(&mut c);
    auth_end(&mut c)
}

/// A replication connection's StartupMessage for `user`, sent.
fn auth_start(addr: SocketAddr, user: &str) -> PgConn {
    let mut c = PgConn::raw(addr);
    c.send_startup(protocol_codec::StartupPacket::startup([
        ("user", user),
        ("replication", "true"),
    ]));
    c
}

/// The rest of an authentication as the side-by-side tests compare it: an error as its
/// severity, SQLSTATE, text and detail; SASL and authentication messages by name; up to
/// ReadyForQuery, or `closed` when the server closes.
fn auth_end(c: &mut PgConn) -> Vec<String> {
    use protocol_codec::{AuthRequest, BackendMessage};
    answers(c, &|m| match m {
        BackendMessage::ErrorResponse(f) => Some(format!(
            "{} (detail: {})",
            error_line(f),
            f.get(b'D').unwrap_or("-")
        )),
        BackendMessage::Authentication(AuthRequest::SaslFinal(_)) => Some("SASLFinal".into()),
        BackendMessage::Authentication(AuthRequest::SaslContinue(_)) => Some("SASLContinue".into()),
        BackendMessage::ParameterStatus { .. } | BackendMessage::BackendKeyData { .. } => None,
        m => Some(format!("{m:?}")),
    })
}

/// The SCRAM exchange up to the client's final message: client-first with `mechanism` and
/// `first`, then the server's first message handed to `last` for the final message.
fn scram_exchange(c: &mut PgConn, mechanism: &str, first: &[u8], last: &dyn Fn(&[u8]) -> Vec<u8>) {
    use protocol_codec::{AuthRequest, BackendMessage, FrontendMessage};
    c.send(FrontendMessage::SaslInitialResponse {
        mechanism: mechanism.into(),
        data: Some(bytes::Bytes::copy_from_slice(first)),
    });
    let server_first = match c.recv() {
        BackendMessage::Authentication(AuthRequest::SaslContinue(b)) => b,
        other => panic!("not SASLContinue: {other:?}"),
    };
    c.send(FrontendMessage::SaslResponse(bytes::Bytes::from(last(
        &server_first,
    ))));
}

/// Authentication's failures, walserver against a real PostgreSQL 15, both asking for
/// SCRAM-SHA-256 of the same role and password: the same client steps get the same end.
#[test]
fn authentication_fails_as_postgresql_15_does() {
    use protocol_codec::auth::{ScramClient, SCRAM_SHA_256};
    use protocol_codec::FrontendMessage;

    let pg = pg_testkit::PgCluster::init_primary(
        &pg_testkit::PgOptions::default().hba("host replication all 127.0.0.1/32 scram-sha-256"),
    );
    pg.create_replication_role("repl", "secret", "scram-sha-256");
    let verifier = make_scram_verifier("secret");
    let node = TestNode::primary(&format!(
        "[users]\nrepl = \"{verifier}\"\n[[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"all\"\nmethod = \"scram-sha-256\"\n"
    ));
    let full = |password: &'static str| {
        move |c: &mut PgConn| {
            let client = std::cell::RefCell::new(ScramClient::new(password, false));
            let first = client.borrow().client_first().to_vec();
            scram_exchange(c, SCRAM_SHA_256, &first, &|server_first| {
                client
                    .borrow_mut()
                    .handle_server_first(server_first)
                    .expect("server-first")
                    .to_vec()
            });
        }
    };
    // A client-final message with the server's nonce and the given binding and proof.
    let tampered = |binding: &'static str, nonce_suffix: &'static str| {
        move |c: &mut PgConn| {
            scram_exchange(
                c,
                SCRAM_SHA_256,
                b"n,,n=,r=abcdefghijklmnop",
                &|server_first| {
                    let text = String::from_utf8_lossy(server_first).to_string();
                    let nonce = text
                        .split(',')
                        .find_map(|a| a.strip_prefix("r="))
                        .expect("a nonce")
                        .to_string();
                    format!("c={binding},r={nonce}{nonce_suffix},p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
                    .into_bytes()
                },
            );
        }
    };
    type Act = Box<dyn Fn(&mut PgConn)>;
    // A SASLInitialResponse with this mechanism and data, and nothing after it.
    let initial = |mechanism: &'static str, data: &'static [u8]| -> Act {
        Box::new(move |c| {
            c.send(FrontendMessage::SaslInitialResponse {
                mechanism: mechanism.into(),
                data: Some(bytes::Bytes::from_static(data)),
            })
        })
    };
    let cases: Vec<(&str, &str, Act)> = vec![
        ("the right password", "repl", Box::new(full("secret"))),
        ("a wrong password", "repl", Box::new(full("wrong"))),
        (
            "a role that does not exist",
            "nobody",
            Box::new(full("secret")),
        ),
        (
            "a mechanism not offered",
            "repl",
            initial("SCRAM-SHA-1", b"n,,n=,r=abcdefghijklmnop"),
        ),
        (
            "a client-first message that is not SCRAM",
            "repl",
            initial(SCRAM_SHA_256, b"garbage"),
        ),
        (
            "channel binding data without the PLUS mechanism",
            "repl",
            initial(
                SCRAM_SHA_256,
                b"p=tls-server-end-point,,n=,r=abcdefghijklmnop",
            ),
        ),
        (
            "no initial response data, then client-first in a SASL response",
            "repl",
            Box::new(|c| {
                use protocol_codec::{AuthRequest, BackendMessage};
                c.send(FrontendMessage::SaslInitialResponse {
                    mechanism: SCRAM_SHA_256.into(),
                    data: None,
                });
                match c.recv() {
                    BackendMessage::Authentication(AuthRequest::SaslContinue(b)) => {
                        assert!(b.is_empty(), "an empty challenge: {b:?}")
                    }
                    other => panic!("not SASLContinue: {other:?}"),
                }
                let mut client = ScramClient::new("secret", false);
                c.send(FrontendMessage::SaslResponse(
                    bytes::Bytes::copy_from_slice(client.client_first()),
                ));
                let server_first = match c.recv() {
                    BackendMessage::Authentication(AuthRequest::SaslContinue(b)) => b,
                    other => panic!("not SASLContinue: {other:?}"),
                };
                let last = client
                    .handle_server_first(&server_first)
                    .expect("server-first");
                c.send(FrontendMessage::SaslResponse(
                    bytes::Bytes::copy_from_slice(last),
                ));
            }),
        ),
        (
            "an empty SASL response",
            "repl",
            initial(SCRAM_SHA_256, b""),
        ),
        ("a wrong proof", "repl", Box::new(tampered("biws", ""))),
        (
            "a nonce that is not the server's",
            "repl",
            Box::new(tampered("biws", "x")),
        ),
        (
            "a binding that is not the header's",
            "repl",
            Box::new(tampered("eSws", "")),
        ),
        (
            "a client-first message with no nonce attribute",
            "repl",
            initial(SCRAM_SHA_256, b"n,,n=,x=1"),
        ),
        (
            "an unknown message type instead of the first SASL response",
            "repl",
            Box::new(|c| c.send_raw(b"z\0\0\0\x04")),
        ),
        (
            "a query instead of the first SASL response",
            "repl",
            Box::new(|c| c.send(FrontendMessage::Query("IDENTIFY_SYSTEM".into()))),
        ),
        (
            "Terminate instead of the first SASL response",
            "repl",
            Box::new(|c| c.send(FrontendMessage::Terminate)),
        ),
        (
            "a query instead of the final SASL response",
            "repl",
            Box::new(move |c| {
                initial(SCRAM_SHA_256, b"n,,n=,r=abcdefghijklmnop")(c);
                let _ = c.recv();
                c.send(FrontendMessage::Query("IDENTIFY_SYSTEM".into()));
            }),
        ),
    ];
    side_by_side(
        &cases,
        &|addr, user, act| auth_answer(addr, user, act.as_ref()),
        pg.addr(),
        node.addr(),
    );
}

/// Password authentication's failures (md5, and cleartext `password`), walserver against a
/// real PostgreSQL 15 with the same roles and passwords: the same client steps get the same
/// end.
#[test]
fn password_authentication_fails_as_postgresql_15_does() {
    use protocol_codec::auth::{make_md5_verifier, md5_response};
    use protocol_codec::{AuthRequest, BackendMessage, FrontendMessage};

    let pg = pg_testkit::PgCluster::init_primary(
        &pg_testkit::PgOptions::default()
            .hba("host replication md 127.0.0.1/32 md5")
            .hba("host replication clear 127.0.0.1/32 password"),
    );
    pg.create_replication_role("md", "secret", "md5");
    pg.create_replication_role("clear", "secret", "scram-sha-256");
    let node = TestNode::primary(&format!(
        "[users]\nmd = \"{}\"\nclear = \"{}\"\n\
         [[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"md\"\nmethod = \"md5\"\n\
         [[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"clear\"\nmethod = \"password\"\n",
        make_md5_verifier("md", "secret"),
        make_scram_verifier("secret"),
    ));
    // What the client sends once asked for a password (given the md5 salt, none for a
    // cleartext request): a PasswordMessage, or another message's bytes.
    type Act = Box<dyn Fn(&str, Option<[u8; 4]>) -> Vec<u8>>;
    let password = |text: &'static str| -> Act {
        Box::new(move |user, salt| {
            let text = match salt {
                Some(salt) => md5_response(user, text, salt),
                None => text.to_string(),
            };
            frame(FrontendMessage::password(&text))
        })
    };
    let cases: Vec<(&str, &str, Act)> = vec![
        ("md5, the right password", "md", password("secret")),
        ("md5, a wrong password", "md", password("wrong")),
        ("cleartext, the right password", "clear", password("secret")),
        ("cleartext, a wrong password", "clear", password("wrong")),
        (
            "md5, an empty password",
            "md",
            Box::new(|_, _| frame(FrontendMessage::password(""))),
        ),
        (
            "cleartext, an empty password",
            "clear",
            Box::new(|_, _| frame(FrontendMessage::password(""))),
        ),
        (
            "a password packet with bytes after its string",
            "clear",
            Box::new(|_, _| {
                frame(FrontendMessage::PasswordMessage(bytes::Bytes::from_static(
                    b"secret\0x",
                )))
            }),
        ),
        (
            "a query instead of the password",
            "md",
            Box::new(|_, _| frame(FrontendMessage::Query("IDENTIFY_SYSTEM".into()))),
        ),
        (
            "Terminate instead of the password",
            "clear",
            Box::new(|_, _| frame(FrontendMessage::Terminate)),
        ),
    ];
    let answer = |addr: SocketAddr, user: &str, act: &Act| {
        let mut c = auth_start(addr, user);
        let salt = match c.recv() {
            BackendMessage::Authentication(AuthRequest::Md5Password { salt }) => Some(salt),
            BackendMessage::Authentication(AuthRequest::CleartextPassword) => None,
            other => panic!("not a password request: {other:?}"),
        };
        c.send_raw(&act(user, salt));
        auth_end(&mut c)
    };
    side_by_side(
        &cases,
        &|addr, user, act| answer(addr, user, act),
        pg.addr(),
        node.addr(),
    );
}

/// Runs each case against PostgreSQL and walserver (`answer` gives what a server ends it
/// with) and fails naming every case where the two differ, after printing all of them.
fn side_by_side<A>(
    cases: &[(&str, &str, A)],
    answer: &dyn Fn(SocketAddr, &str, &A) -> Vec<String>,
    pg: SocketAddr,
    ws: SocketAddr,
) {
    let mut differ = Vec::new();
    for (what, user, act) in cases {
        let theirs = answer(pg, user, act);
        let ours = answer(ws, user, act);
        eprintln!("{what}:\n  pg: {theirs:?}\n  ws: {ours:?}");
        if ours != theirs {
            differ.push(*what);
        }
    }
    assert!(
        differ.is_empty(),
        "walserver differs from PostgreSQL 15 on: {differ:?}"
    );
}

/// A frontend message's bytes on the wire.
fn frame(m: protocol_codec::FrontendMessage) -> Vec<u8> {
    let mut b = bytes::BytesMut::new();
    m.encode(&mut b).expect("encodes");
    b.to_vec()
}

/// The timeouts, walserver against a real PostgreSQL 15, both with `authentication_timeout`
/// and `wal_sender_timeout` at one second: what a client that falls silent receives, and that
/// neither server ends the connection before its timeout. A client silent before its startup
/// packet is closed without a word by both. A client silent while streaming gets one
/// keepalive asking for a reply (at half the timeout), then the close, from both. A client
/// silent in the middle of authentication differs on purpose: PostgreSQL closes without a
/// word (its FATAL goes to its log only), walserver sends that FATAL first, so that the
/// client can say why.
#[test]
fn timeouts_end_connections_as_postgresql_15_does() {
    use protocol_codec::{AuthRequest, BackendMessage};
    use std::time::{Duration, Instant};

    let timeout = Duration::from_secs(1);
    let pg = pg_testkit::PgCluster::init_primary(
        &pg_testkit::PgOptions::default()
            .conf("authentication_timeout = '1s'")
            .conf("wal_sender_timeout = '1s'")
            .hba("host replication repl 127.0.0.1/32 scram-sha-256"),
    );
    pg.create_replication_role("repl", "secret", "scram-sha-256");
    let node = TestNode::primary(&format!(
        "authentication_timeout = \"1s\"\nwal_sender_timeout = \"1s\"\n\
         [users]\nrepl = \"{}\"\n\
         [[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"repl\"\nmethod = \"scram-sha-256\"\n\
         [[hba]]\naddress = \"127.0.0.1/32\"\nuser = \"all\"\nmethod = \"trust\"\n",
        make_scram_verifier("secret")
    ));
    // Everything a silent client receives until the close (WAL aside), and how long after
    // its last step the close came.
    let until_closed = |c: &mut PgConn| -> (Vec<String>, Duration) {
        let since = Instant::now();
        let out = answers(c, &|m| match m {
            BackendMessage::XLogData(_) => None,
            BackendMessage::PrimaryKeepalive(k) => {
                Some(format!("keepalive, reply requested: {}", k.reply_requested))
            }
            BackendMessage::ErrorResponse(f) => Some(error_line(f)),
            m => Some(format!("{m:?}")),
        });
        (out, since.elapsed())
    };

    let before_startup = |addr| until_closed(&mut PgConn::raw(addr));
    let mid_authentication = |addr| {
        let mut c = auth_start(addr, "repl");
        match c.recv() {
            BackendMessage::Authentication(AuthRequest::Sasl { .. }) => {}
            other => panic!("not a SASL request: {other:?}"),
        }
        until_closed(&mut c)
    };
    let streaming = |addr, user| {
        let mut c = PgConn::connect(addr, user, None).expect("connect");
        let start = c.client.identify_system().expect("IDENTIFY_SYSTEM").xlogpos;
        c.start_replication(start);
        until_closed(&mut c)
    };

    let mut took = Vec::new();
    let theirs = before_startup(pg.addr());
    let ours = before_startup(node.addr());
    eprintln!("silent before the startup packet: {theirs:?} {ours:?}");
    assert_eq!(theirs.0, ["closed"]);
    assert_eq!(ours.0, theirs.0);
    took.extend([("before the startup packet", theirs.1, ours.1)]);

    let theirs = mid_authentication(pg.addr());
    let ours = mid_authentication(node.addr());
    eprintln!("silent in authentication: {theirs:?} {ours:?}");
    assert_eq!(theirs.0, ["closed"]);
    assert_eq!(
        ours.0,
        [
            "FATAL 57014 canceling authentication due to timeout",
            "closed"
        ]
    );
    took.extend([("in authentication", theirs.1, ours.1)]);

    let theirs = streaming(pg.addr(), "postgres");
    let ours = streaming(node.addr(), "u");
    eprintln!("silent while streaming: {theirs:?} {ours:?}");
    assert_eq!(theirs.0, ["keepalive, reply requested: true", "closed"]);
    assert_eq!(ours.0, theirs.0);
    took.extend([("while streaming", theirs.1, ours.1)]);

    // A timeout may end a connection late on a busy machine, never early. Each measurement
    // starts once the client's last step is done, a little after the server's clock started,
    // hence the margin.
    for (what, pg_took, ws_took) in took {
        assert!(
            pg_took >= timeout.mul_f32(0.8),
            "PostgreSQL, silent {what}: closed after {pg_took:?}"
        );
        assert!(
            ws_took >= timeout.mul_f32(0.8),
            "walserver, silent {what}: closed after {ws_took:?}"
        );
    }
}

/// A replication slot in use, walserver against a real PostgreSQL 15: while one connection
/// streams from slot `s`, another gets the same answers to streaming from it, dropping it,
/// creating it again and reading it; then `DROP_REPLICATION_SLOT s WAIT` waits until the
/// first connection ends its copy and drops the slot. The holder's process id in the texts is
/// written `PID <holder>`: each server names its own, the one its BackendKeyData gave.
#[test]
fn a_slot_in_use_is_refused_as_postgresql_15_does() {
    use protocol_codec::BackendMessage;

    let pg = pg_testkit::PgCluster::init_primary(&pg_testkit::PgOptions::default());
    let node = TestNode::primary("");
    let run = |addr: SocketAddr, user: &str| -> Vec<String> {
        let mut holder = PgConn::connect(addr, user, None).expect("connect");
        let pid = holder
            .client
            .session()
            .backend_key
            .expect("BackendKeyData")
            .0;
        let start = holder
            .client
            .identify_system()
            .expect("IDENTIFY_SYSTEM")
            .xlogpos;
        holder.query("CREATE_REPLICATION_SLOT s PHYSICAL RESERVE_WAL");
        holder.send(protocol_codec::FrontendMessage::Query(format!(
            "START_REPLICATION SLOT s PHYSICAL {start}"
        )));
        match holder.recv() {
            BackendMessage::CopyBothResponse => {}
            other => panic!("not CopyBothResponse: {other:?}"),
        }
        let name = |m: &BackendMessage| match m {
            BackendMessage::ErrorResponse(f) => {
                Some(error_line(f).replace(&format!("PID {pid}"), "PID <holder>"))
            }
            BackendMessage::RowDescription(_) | BackendMessage::DataRow(_) => None,
            m => Some(format!("{m:?}")),
        };
        let mut other = PgConn::connect(addr, user, None).expect("connect");
        let mut out = Vec::new();
        for q in [
            format!("START_REPLICATION SLOT s PHYSICAL {start}"),
            "DROP_REPLICATION_SLOT s".to_string(),
            "CREATE_REPLICATION_SLOT s PHYSICAL".to_string(),
            "READ_REPLICATION_SLOT s".to_string(),
        ] {
            other.send(protocol_codec::FrontendMessage::Query(q.clone()));
            let q = q.replace(&start.to_string(), "<start>");
            out.push(format!("{q}: {:?}", answers(&mut other, &name)));
        }
        other.send(protocol_codec::FrontendMessage::Query(
            "DROP_REPLICATION_SLOT s WAIT".into(),
        ));
        holder.send(protocol_codec::FrontendMessage::CopyDone);
        out.push(format!(
            "holder's CopyDone: {:?}",
            answers(&mut holder, &|m| match m {
                BackendMessage::XLogData(_) | BackendMessage::PrimaryKeepalive(_) => None,
                m => name(m),
            })
        ));
        out.push(format!(
            "DROP_REPLICATION_SLOT s WAIT: {:?}",
            answers(&mut other, &name)
        ));
        other.send(protocol_codec::FrontendMessage::Query(
            "READ_REPLICATION_SLOT s".into(),
        ));
        out.push(format!(
            "READ_REPLICATION_SLOT s after: {:?}",
            answers(&mut other, &|m| match m {
                BackendMessage::DataRow(r) => Some(format!("{r:?}")),
                m => name(m),
            })
        ));
        out
    };
    assert_same_answers(&run, pg.addr(), node.addr());
}

/// Streaming from WAL that is gone, walserver against a real PostgreSQL 15: both removed the
/// first segments (a checkpoint after a few segment switches on PostgreSQL, retention with
/// `wal_keep_size = 0` on walserver), and START_REPLICATION from their first WAL position gets
/// the same answer from both. Segment file names are written `<segment>`: the two servers'
/// segment sizes differ.
#[test]
fn streaming_from_removed_wal_is_refused_as_postgresql_15_does() {
    use protocol_codec::{BackendMessage, FrontendMessage};

    let pg = pg_testkit::PgCluster::init_primary(
        &pg_testkit::PgOptions::default().conf("wal_keep_size = 0"),
    );
    pg.psql("CREATE TABLE t (x int)");
    for _ in 0..3 {
        pg.psql("INSERT INTO t VALUES (1)");
        pg.psql("SELECT pg_switch_wal()");
    }
    pg.psql("CHECKPOINT");
    let seg = 1 << 20;
    let node = TestNode::primary_with_segments(seg, "wal_keep_size = 0\n");
    let first = node.wal().flushed();
    for i in 0..4 {
        node.append(4, (seg / 4) as usize, i);
    }
    node.wal().run_retention().expect("retention");
    let answer = |addr: SocketAddr, user: &str, start: Lsn| {
        let mut c = PgConn::connect(addr, user, None).expect("connect");
        c.send(FrontendMessage::Query(format!("START_REPLICATION {start}")));
        answers(&mut c, &|m| match m {
            BackendMessage::XLogData(_) | BackendMessage::PrimaryKeepalive(_) => None,
            BackendMessage::ErrorResponse(f) => {
                let line = error_line(f);
                Some(match line.find("segment ") {
                    Some(i) => format!("{}segment <segment>{}", &line[..i], &line[i + 32..]),
                    None => line,
                })
            }
            m => Some(format!("{m:?}")),
        })
    };
    let theirs = answer(pg.addr(), "postgres", Lsn(0x100_0000));
    let ours = answer(node.addr(), "u", first);
    eprintln!("pg: {theirs:?}\nws: {ours:?}");
    assert_eq!(ours, theirs);
}

/// SCRAM channel binding over TLS, walserver against a real PostgreSQL 15 with the same
/// certificate, role and password: a client that binds gets SCRAM-SHA-256-PLUS from both; one
/// bound to another certificate (what a man in the middle would present) is refused by both
/// with the same FATAL; one that does not bind gets SCRAM-SHA-256 from both; and psql with
/// `channel_binding=require` connects to both.
#[test]
fn scram_channel_binding_works_as_with_postgresql_15() {
    use protocol_codec::auth::ChannelBindingMode;
    use protocol_codec::tls::SslMode;
    use repl_client::{ConnectOptions, ReplClient, TlsOptions};

    let bin = PgBin::require();
    let pki = pg_testkit::TestPki::new(&["localhost", "127.0.0.1"]);
    let certs = tempfile::tempdir().unwrap();
    let files = pki.write_to(certs.path());
    let pg = pg_testkit::PgCluster::init_primary(
        &pg_testkit::PgOptions::default()
            .tls(&pki)
            .hba("hostssl replication repl 127.0.0.1/32 scram-sha-256"),
    );
    pg.create_replication_role("repl", "secret", "scram-sha-256");
    let node = TestNode::primary(&format!(
        "ssl_cert_file = {:?}\nssl_key_file = {:?}\n[users]\nrepl = \"{}\"\n\
         [[hba]]\ntype = \"hostssl\"\naddress = \"127.0.0.1/32\"\nuser = \"all\"\nmethod = \"scram-sha-256\"\n",
        files.cert.display().to_string(),
        files.key.display().to_string(),
        make_scram_verifier("secret")
    ));
    // The mechanism a TLS login used, or the server's FATAL.
    let login = |addr: SocketAddr, binding: Option<ChannelBindingMode>| -> String {
        let mut tls = TlsOptions::new(SslMode::VerifyFull, Some(&files.root), "localhost")
            .expect("TLS options");
        tls.channel_binding = binding;
        let options = ConnectOptions::new("repl", Some("secret"), "binding")
            .read_timeout(DEADLINE)
            .tls(tls);
        match ReplClient::connect_with(addr, &options) {
            Ok(c) => format!("authenticated with {:?}", c.session().mechanism),
            Err(e) => match e.server_error() {
                Some(f) => error_line(f),
                None => format!("failed without the server's error: {e}"),
            },
        }
    };
    let cases = [
        ("bound to the certificate presented", None),
        (
            "bound to another certificate",
            Some(ChannelBindingMode::TlsServerEndPoint(vec![0; 32])),
        ),
        ("not binding", Some(ChannelBindingMode::TlsWithoutBinding)),
    ];
    for (what, binding) in cases {
        let theirs = login(pg.addr(), binding.clone());
        let ours = login(node.addr(), binding);
        eprintln!("{what}:\n  pg: {theirs}\n  ws: {ours}");
        assert_eq!(ours, theirs, "{what}");
    }
    assert_eq!(
        login(node.addr(), None),
        "authenticated with Some(\"SCRAM-SHA-256-PLUS\")"
    );
    // libpq insisting on channel binding.
    for (who, port) in [("PostgreSQL", pg.port()), ("walserver", node.addr().port())] {
        let out = Command::new(bin.tool("psql"))
            .arg(format!(
                "host=localhost port={port} user=repl replication=true sslmode=verify-full \
                 sslrootcert={} channel_binding=require",
                files.root.display()
            ))
            .args(["-X", "-A", "-t", "-c", "IDENTIFY_SYSTEM"])
            .env("PGPASSWORD", "secret")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{who}: psql with channel_binding=require: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `max_wal_senders` reached, walserver against a real PostgreSQL 15, both at one: while one
/// connection is open, the next is refused with the same FATAL by both; once the first has
/// gone, a new one is let in by both.
#[test]
fn max_wal_senders_refuses_as_postgresql_15_does() {
    let pg = pg_testkit::PgCluster::init_primary(
        &pg_testkit::PgOptions::default().conf("max_wal_senders = 1"),
    );
    let node = TestNode::primary("max_wal_senders = 1\n");
    let run = |addr: SocketAddr, user: &str| -> Vec<String> {
        let first = PgConn::connect(addr, user, None).expect("the first connection");
        let refused = match PgConn::connect(addr, user, None) {
            Ok(_) => "let in".to_string(),
            Err(m) => match m {
                protocol_codec::BackendMessage::ErrorResponse(f) => error_line(&f),
                other => format!("{other:?}"),
            },
        };
        first.client.close();
        // The first connection's slot is free once its server side has seen the close;
        // a new attempt is let in from then on (the deadline bounds the wait).
        let mut again = String::new();
        wait_until("a connection to be let in after the first one left", || {
            again = match PgConn::connect(addr, user, None) {
                Ok(_) => "let in".to_string(),
                Err(_) => "refused".to_string(),
            };
            again == "let in"
        });
        vec![refused, again]
    };
    let theirs = run(pg.addr(), "postgres");
    let ours = run(node.addr(), "u");
    eprintln!("pg: {theirs:?}\nws: {ours:?}");
    assert_eq!(ours, theirs);
}

/// Replication commands PostgreSQL 15 cannot parse, or whose names no slot or parameter has,
/// walserver against a real PostgreSQL 15: the same SQLSTATE and words, and no position (its
/// replication command parser sends none, unlike its SQL parser), the session going on.
#[test]
fn bad_replication_commands_are_answered_as_postgresql_15_answers_them() {
    use protocol_codec::BackendMessage;

    let pg = pg_testkit::PgCluster::init_primary(&pg_testkit::PgOptions::default());
    let node = TestNode::primary("");
    let commands = [
        "IDENTIFY_SYSTEM x",
        "SHOW",
        "SHOW a!",
        "SHOW \"é\" x",
        "SHOW \"\"",
        "SHOW \"wal_segment_size",
        "TIMELINE_HISTORY 0",
        "TIMELINE_HISTORY x",
        "TIMELINE_HISTORY 1 2",
        "START_REPLICATION",
        "START_REPLICATION SLOT 0/0",
        "START_REPLICATION 0/0 TIMELINE",
        "START_REPLICATION 0/0; x",
        "START_REPLICATION SLOT \"\" 0/0",
        "CREATE_REPLICATION_SLOT s",
        "CREATE_REPLICATION_SLOT \"\" PHYSICAL",
        "CREATE_REPLICATION_SLOT s PHYSICAL ()",
        "CREATE_REPLICATION_SLOT s PHYSICAL (TWO_PHASE)",
        "CREATE_REPLICATION_SLOT s PHYSICAL (RESERVE_WAL maybe)",
        "CREATE_REPLICATION_SLOT s PHYSICAL (RESERVE_WAL, RESERVE_WAL)",
        "CREATE_REPLICATION_SLOT s PHYSICAL TWO_PHASE",
        "DROP_REPLICATION_SLOT \"\"",
        "DROP_REPLICATION_SLOT \"s",
        "DROP_REPLICATION_SLOT 's",
        "DROP_REPLICATION_SLOT s NOW",
    ];
    let run = |addr: SocketAddr, user: &str| -> Vec<String> {
        let mut c = PgConn::connect(addr, user, None).expect("connect");
        let mut out = Vec::new();
        for q in commands {
            c.send(protocol_codec::FrontendMessage::Query(q.into()));
            out.push(q.to_string());
            out.extend(answers(&mut c, &|m| match m {
                BackendMessage::ErrorResponse(f) => Some(format!(
                    "{} POSITION {}",
                    error_line(f),
                    f.get(b'P').unwrap_or("-")
                )),
                BackendMessage::ReadyForQuery(_) => Some("ReadyForQuery".into()),
                _ => None,
            }));
        }
        out
    };
    assert_same_answers(&run, pg.addr(), node.addr());
}

/// Messages of the protocol beside the simple query, walserver against a real PostgreSQL 15:
/// the extended query protocol is refused with an ERROR and everything up to the client's Sync
/// skipped (a query in between included), a function call is refused, a Flush or Sync alone is
/// harmless, and an unknown message type ends the connection with PostgreSQL's words.
#[test]
fn messages_beside_simple_queries_are_answered_as_postgresql_15_answers_them() {
    use bytes::Bytes;
    use protocol_codec::{BackendMessage, FrontendMessage};

    let pg = pg_testkit::PgCluster::init_primary(&pg_testkit::PgOptions::default());
    let node = TestNode::primary("");
    let extended = |tag: u8, body: &'static [u8]| FrontendMessage::ExtendedQuery {
        tag,
        body: Bytes::from_static(body),
    };
    let steps: Vec<(&str, Vec<FrontendMessage>)> = vec![
        (
            "Parse, Bind, Execute, a query, Sync",
            vec![
                extended(b'P', b"\0IDENTIFY_SYSTEM\0\0\0"),
                extended(b'B', b"\0\0\0\0\0\0\0\0"),
                extended(b'E', b"\0\0\0\0\0"),
                FrontendMessage::Query("IDENTIFY_SYSTEM".into()),
                FrontendMessage::Sync,
            ],
        ),
        (
            "a function call",
            vec![FrontendMessage::FunctionCall(Bytes::from_static(
                b"\0\0\0\x01\0\0\0\0\0\0",
            ))],
        ),
        (
            "Flush, then a query",
            vec![
                FrontendMessage::Flush,
                FrontendMessage::Query("SHOW data_directory_mode".into()),
            ],
        ),
        ("Sync alone", vec![FrontendMessage::Sync]),
        ("an unknown type", vec![extended(b'z', b"")]),
    ];
    let run = |addr: SocketAddr, user: &str| -> Vec<String> {
        let mut c = PgConn::connect(addr, user, None).expect("connect");
        let mut out = Vec::new();
        for (what, messages) in &steps {
            out.push(what.to_string());
            for m in messages {
                c.send(m.clone());
            }
            out.extend(answers(&mut c, &|m| match m {
                BackendMessage::ErrorResponse(f) => Some(error_line(f)),
                BackendMessage::RowDescription(_) => None,
                m => Some(format!("{m:?}")),
            }));
        }
        out
    };
    assert_same_answers(&run, pg.addr(), node.addr());
}

/// `run` against PostgreSQL (as `postgres`) and walserver (as `u`): the same lines from both,
/// printed side by side.
fn assert_same_answers(
    run: &dyn Fn(SocketAddr, &str) -> Vec<String>,
    pg: SocketAddr,
    node: SocketAddr,
) {
    let theirs = run(pg, "postgres");
    let ours = run(node, "u");
    for (t, o) in theirs.iter().zip(&ours) {
        eprintln!("pg: {t}\nws: {o}");
    }
    assert_eq!(ours, theirs);
}

/// A message as the startup-parameter tests compare it: a row, an error with its hint and
/// detail, anything else by its name; the messages whose contents differ between the servers
/// (key data, row descriptions, command tags) left out.
fn answer_line(m: &protocol_codec::BackendMessage) -> Option<String> {
    use protocol_codec::BackendMessage;
    match m {
        BackendMessage::BackendKeyData { .. }
        | BackendMessage::RowDescription(_)
        | BackendMessage::CommandComplete(_) => None,
        BackendMessage::DataRow(r) => Some(format!("{r:?}")),
        BackendMessage::ErrorResponse(f) => Some(format!(
            "{} HINT {} DETAIL {}",
            error_line(f),
            f.get(b'H').unwrap_or("-"),
            f.get(b'D').unwrap_or("-")
        )),
        m => Some(format!("{m:?}")),
    }
}

/// The names to `SHOW` after a startup packet with these parameters.
type ShowsFor = dyn Fn(&[(&str, &str)]) -> Vec<String>;

/// Each case's startup packet (`user`, `replication=true`, then the case's parameters) sent to
/// PostgreSQL (as `postgres`) and to walserver (as `u`), then, if the server took it, `SHOW`
/// of each name `shown` gives for the case; every message `name` names compared. Returns the
/// cases whose answers differ.
fn startup_cases_differ<'a>(
    pg: SocketAddr,
    node: SocketAddr,
    cases: &[(&'a str, Vec<(&str, &str)>)],
    shown: &ShowsFor,
    name: &dyn Fn(&protocol_codec::BackendMessage) -> Option<String>,
) -> Vec<&'a str> {
    let answer = |addr: SocketAddr, user: &str, params: &[(&str, &str)]| -> Vec<String> {
        let mut c = PgConn::raw(addr);
        let mut all = vec![("user", user), ("replication", "true")];
        all.extend(params.iter().cloned());
        c.send_startup(protocol_codec::StartupPacket::startup(all));
        let mut out = answers(&mut c, name);
        if out.last().map(String::as_str) == Some("closed") {
            return out;
        }
        for n in shown(params) {
            let q = format!("SHOW {n}");
            c.send(protocol_codec::FrontendMessage::Query(q.clone()));
            out.push(q);
            out.extend(answers(&mut c, name));
        }
        out
    };
    let mut differ = Vec::new();
    for (what, params) in cases {
        let theirs = answer(pg, "postgres", params);
        let ours = answer(node, "u", params);
        eprintln!("{what}:\n  pg: {theirs:?}\n  ws: {ours:?}");
        assert!(
            theirs.iter().any(|m| m.starts_with("Authentication")),
            "{what}: PostgreSQL authenticated the client first"
        );
        if ours != theirs {
            differ.push(*what);
        }
    }
    differ
}

/// The configuration parameters a client sets when it connects (the startup packet's
/// `options`, as `PGOPTIONS` or `options=` in a conninfo passes them, and the other startup
/// parameters), walserver against a real PostgreSQL 15: the same packets get the same answer,
/// the FATAL after AuthenticationOk for a parameter that is unknown, one a client may not set,
/// a malformed `options` or a bad `wal_sender_timeout`, and otherwise the same SHOW answers
/// (the client's `wal_sender_timeout` in PostgreSQL's form, its `application_name`, a custom
/// parameter, the primary's role). Then a client that set `wal_sender_timeout=1s` on a node whose own is a minute
/// is ended for its silence by its own timeout.
#[test]
fn client_parameters_are_read_as_postgresql_15_reads_them() {
    use protocol_codec::{BackendMessage, StartupPacket};
    use std::time::{Duration, Instant};

    let pg = pg_testkit::PgCluster::init_primary(&pg_testkit::PgOptions::default());
    let node = TestNode::primary("wal_sender_timeout = \"1min\"");
    let name = |m: &BackendMessage| match m {
        BackendMessage::ParameterStatus { .. } => None,
        m => answer_line(m),
    };
    let shown = |_: &[(&str, &str)]| {
        [
            "wal_sender_timeout",
            "application_name",
            "my.setting",
            "tcp_keepalives_idle",
            "tcp_keepalives_interval",
            "tcp_keepalives_count",
            "tcp_user_timeout",
            "in_hot_standby",
            "transaction_read_only",
            "default_transaction_read_only",
        ]
        .map(String::from)
        .to_vec()
    };
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        (
            "options setting wal_sender_timeout, application_name and a custom parameter",
            vec![(
                "options",
                "-c wal_sender_timeout=1500 --application-name=from\\ options -cmy.setting=on",
            )],
        ),
        (
            "application_name in the packet after one in options",
            vec![
                (
                    "options",
                    "-c application_name=opt -c my.setting=1 -c my.setting=2",
                ),
                ("application_name", "param"),
            ],
        ),
        (
            "wal_sender_timeout as a startup parameter, in hours",
            vec![("wal_sender_timeout", "2h"), ("my.setting", "x")],
        ),
        (
            "parameters walserver has no use for",
            vec![
                (
                    "options",
                    "-c statement_timeout=0 -c DateStyle=ISO -c work_mem=1MB",
                ),
                ("TimeZone", "UTC"),
                ("extra_float_digits", "3"),
                ("my.setting", "1"),
            ],
        ),
        (
            "the connection's keepalive timing",
            vec![(
                "options",
                "-c tcp_keepalives_idle=1500ms -c tcp_keepalives_interval=1min -c tcp_keepalives_count=3 -c tcp_user_timeout=2s",
            )],
        ),
        (
            "a keepalive count with a unit",
            vec![("options", "-c tcp_keepalives_count=3s")],
        ),
        (
            "a negative keepalive idle time",
            vec![("tcp_keepalives_idle", "-3")],
        ),
        ("an unknown parameter", vec![("options", "-c nosuch=1")]),
        ("an unknown startup parameter", vec![("nosuch", "1")]),
        (
            "a parameter read at server start",
            vec![("options", "-c shared_buffers=1MB")],
        ),
        (
            "a parameter of the configuration file",
            vec![("options", "-c wal_keep_size=1")],
        ),
        ("a parameter fixed at build", vec![("server_version", "1")]),
        ("an unknown switch", vec![("options", "-x")]),
        (
            "a word that is no switch",
            vec![("options", "-c wal_sender_timeout=3s extra")],
        ),
        (
            "a switch without a value",
            vec![("options", "-c wal_sender_timeout")],
        ),
        ("a bad custom name", vec![("options", "-c my..setting=1")]),
        (
            "a wal_sender_timeout that is no number",
            vec![("options", "-c wal_sender_timeout=abc")],
        ),
        (
            "a wal_sender_timeout of an unknown unit",
            vec![("options", "-c wal_sender_timeout=5x")],
        ),
        (
            "a negative wal_sender_timeout",
            vec![("options", "-c wal_sender_timeout=-5")],
        ),
        (
            "a wal_sender_timeout beyond an integer",
            vec![("options", "-c wal_sender_timeout=9999999999")],
        ),
    ];
    let differ = startup_cases_differ(pg.addr(), node.addr(), &cases, &shown, &name);
    assert!(
        differ.is_empty(),
        "walserver differs from PostgreSQL 15 on: {differ:?}"
    );

    // The client's timeout is the one that holds: silent while streaming, it gets a keepalive
    // asking for a reply, then the close, a second or so later rather than a minute.
    let mut c = PgConn::raw(node.addr());
    c.send_startup(StartupPacket::startup([
        ("user", "u"),
        ("replication", "true"),
        ("options", "-c wal_sender_timeout=1s"),
    ]));
    c.until_ready();
    let start = c.client.identify_system().expect("IDENTIFY_SYSTEM").xlogpos;
    c.start_replication(start);
    let since = Instant::now();
    let out = answers(&mut c, &|m| match m {
        BackendMessage::XLogData(_) => None,
        BackendMessage::PrimaryKeepalive(k) => {
            Some(format!("keepalive, reply requested: {}", k.reply_requested))
        }
        m => Some(format!("{m:?}")),
    });
    let took = since.elapsed();
    assert_eq!(out, ["keepalive, reply requested: true", "closed"]);
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(20),
        "closed after {took:?}"
    );
}

/// The values a client sets when it connects, read and reported back as PostgreSQL 15 reads and
/// reports them: the ParameterStatus of the greeting (a walsender for physical replication has
/// the encoding `SQL_ASCII`; a client's `client_encoding`, `DateStyle`, `IntervalStyle`,
/// `TimeZone`, `standard_conforming_strings`, `default_transaction_read_only` and
/// `application_name` in PostgreSQL's form), SHOW of what the client set (booleans as on/off,
/// sizes and times in their largest whole unit, floating-point values as C's `%g`, enum
/// aliases), and the FATAL for a value PostgreSQL refuses, walserver against a real PostgreSQL
/// 15 with the same packets.
#[test]
fn client_values_are_reported_as_postgresql_15_reports_them() {
    use protocol_codec::BackendMessage;

    let pg = pg_testkit::PgCluster::init_primary(
        &pg_testkit::PgOptions::default().conf("timezone = 'Etc/UTC'"),
    );
    let node = TestNode::primary("");
    let name = |m: &BackendMessage| match m {
        // Not the same for both: the server's version and the user's name.
        BackendMessage::ParameterStatus { name, .. }
            if name == "server_version" || name == "session_authorization" =>
        {
            None
        }
        BackendMessage::ParameterStatus { name, value } => Some(format!("{name}={value}")),
        // PostgreSQL's LOG lines, which `client_min_messages=debug` lets through to the client.
        BackendMessage::NoticeResponse(_) => None,
        // SHOW's column is the parameter's name as PostgreSQL spells it.
        BackendMessage::RowDescription(fields) => Some(format!(
            "columns {:?}",
            fields.iter().map(|f| &f.name).collect::<Vec<_>>()
        )),
        m => answer_line(m),
    };
    // SHOW of what the greeting reports, then of every parameter the case sets.
    let shown = |params: &[(&str, &str)]| {
        let mut shown: Vec<String> = [
            "client_encoding",
            "server_encoding",
            "DateStyle",
            "TimeZone",
            "IntervalStyle",
            "standard_conforming_strings",
            "application_name",
            "is_superuser",
        ]
        .map(String::from)
        .to_vec();
        for (n, v) in params {
            if *n == "options" {
                // What each switch sets (`-c name=value`, `-S 4096` is work_mem, ...); if
                // walserver reads a switch as the wrong parameter, PostgreSQL's SHOW of that
                // parameter differs.
                let set = protocol_codec::client_settings::split_options(v).unwrap_or_default();
                shown.extend(set.into_iter().map(|(n, _)| n));
            } else {
                shown.push(n.to_string());
            }
        }
        shown
    };
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("nothing set", vec![]),
        ("an encoding's alias", vec![("client_encoding", "latin1")]),
        ("an encoding's other spelling", vec![("client_encoding", "utf-8")]),
        ("UNICODE, kept for old drivers", vec![("client_encoding", "UNICODE")]),
        ("no such encoding", vec![("client_encoding", "foo")]),
        ("libpq's auto, which only libpq reads", vec![("client_encoding", "auto")]),
        ("a date style", vec![("DateStyle", "sql, dmy")]),
        ("German, which sets its order", vec![("DateStyle", "German")]),
        (
            "a date style over the one before it",
            vec![("options", "-c DateStyle=German"), ("DateStyle", "ymd")],
        ),
        ("conflicting date styles", vec![("DateStyle", "iso,sql")]),
        ("an unknown date style", vec![("DateStyle", "bogus")]),
        ("a date style without commas", vec![("DateStyle", "ISO MDY")]),
        ("a time zone", vec![("TimeZone", "Europe/Berlin")]),
        ("an interval style in capitals", vec![("IntervalStyle", "ISO_8601")]),
        ("an unknown interval style", vec![("IntervalStyle", "x")]),
        (
            "booleans and application_name",
            vec![
                ("standard_conforming_strings", "of"),
                ("default_transaction_read_only", "TRUE"),
                ("application_name", "é x"),
            ],
        ),
        ("not a boolean", vec![("enable_seqscan", "maybe")]),
        (
            "sizes, times and numbers",
            vec![(
                "options",
                "-c work_mem=4096 -c temp_buffers=100 -c statement_timeout=60000 -c vacuum_cost_delay=1.5ms -c seq_page_cost=1.23456789 -c extra_float_digits=0x3 -c cursor_tuple_fraction=1e-5",
            )],
        ),
        (
            "enum aliases",
            vec![(
                "options",
                "-c synchronous_commit=TRUE -c wal_compression=on -c client_min_messages=debug",
            )],
        ),
        (
            "the server's other switches",
            vec![(
                "options",
                "-S 4096 -e -fs -tpa -d 3 -T -W 0 -- ",
            )],
        ),
        ("a switch a client may not give", vec![("options", "-B 128")]),
        ("a switch of the configuration file", vec![("options", "-F")]),
        ("switches clustered", vec![("options", "-eP -ftx")]),
        ("an unknown -f letter", vec![("options", "-fx")]),
        ("an unknown -t name", vec![("options", "-tzz")]),
        ("a debug level beyond 5", vec![("options", "-d 6")]),
        ("a word after --", vec![("options", "-e -- extra")]),
        ("an integer out of range", vec![("extra_float_digits", "9")]),
        ("a size below its least", vec![("temp_buffers", "1kB")]),
        ("a size in a unit not spelt so", vec![("work_mem", "5KB")]),
        ("a time out of range", vec![("vacuum_cost_delay", "200")]),
        ("a negative cost", vec![("seq_page_cost", "-1")]),
        ("a number beyond a double", vec![("statement_timeout", "1e400")]),
    ];
    let differ = startup_cases_differ(pg.addr(), node.addr(), &cases, &shown, &name);
    assert!(
        differ.is_empty(),
        "walserver differs from PostgreSQL 15 on: {differ:?}"
    );
}
