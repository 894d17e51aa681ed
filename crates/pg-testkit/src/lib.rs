//! pg-testkit: real PostgreSQL 15 for walserver's interop tests.
//!
//! It finds PostgreSQL 15's binaries ([`PgBin`]) and runs throwaway clusters ([`PgCluster`])
//! in temporary directories on free loopback ports, stopped and removed on drop. Tests that
//! use it are meant to fail, never skip, when PostgreSQL 15 is missing: the panic says how to
//! install it.
//!
//! PostgreSQL refuses to run as root. When the tests run as root (as CI does), every server
//! program runs as the `postgres` user through `runuser`, and the cluster's directory is
//! handed to that user; otherwise programs run directly.
//!
//! Waiting is bounded and only on the external server: `pg_ctl start -w` waits on the
//! postmaster's own readiness report, and [`PgCluster::wait_for`] re-runs a query until a
//! deadline (a standby catching up has no other signal to wait on).
//!
//! TLS: [`TestPki`] makes a throwaway CA and server certificate.
//!
//! Standbys: [`PgCluster::init_standby_from`] makes one with `pg_basebackup -R`, optionally
//! pointing its `primary_conninfo` elsewhere (at a walserver, say).
//!
//! Point-in-time recovery: [`PgCluster::base_backup`] takes a backup without WAL and
//! [`PgCluster::recover_from`] starts a server from it with a `restore_command` and a
//! recovery target.
//!
//! Object storage: [`SeaweedServer`] runs SeaweedFS's S3 gateway with one bucket, for the
//! archive's tests (`seaweed.rs`), and can stop and continue it (SIGSTOP) as a store that
//! hangs.

mod pki;
mod seaweed;

pub use pki::{PkiFiles, TestPki};
pub use seaweed::{
    find_weed, EnterNamespace, SeaweedServer, SEAWEED_ACCESS_KEY_ID, SEAWEED_SECRET_ACCESS_KEY,
    WEED_INSTALL_HINT,
};

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The PostgreSQL major version walserver is compatible with.
pub const PG_MAJOR: &str = "15";

const INSTALL_HINT: &str = "PostgreSQL 15 is required for walserver's interop tests. Install it \
with `apt-get install postgresql-15` (Debian/Ubuntu; ./scripts/test.sh does this), or point \
WALSERVER_PG_BIN at a directory holding PostgreSQL 15's initdb, pg_ctl and postgres.";

/// Where PostgreSQL 15's programs are.
#[derive(Clone, Debug)]
pub struct PgBin {
    dir: PathBuf,
}

impl PgBin {
    /// Looks in `$WALSERVER_PG_BIN`, then `/usr/lib/postgresql/15/bin`, then
    /// `pg_config --bindir`, and checks that `postgres` there is version 15.
    pub fn find() -> Result<PgBin, String> {
        PgBin::find_in(std::env::var_os("WALSERVER_PG_BIN").map(PathBuf::from))
    }

    /// [`PgBin::find`] with the value of `WALSERVER_PG_BIN` passed in: when it is set, that
    /// directory is the only place looked at.
    fn find_in(explicit: Option<PathBuf>) -> Result<PgBin, String> {
        let mut candidates = Vec::new();
        if let Some(dir) = explicit {
            candidates.push(dir);
        } else {
            candidates.push(PathBuf::from("/usr/lib/postgresql/15/bin"));
            if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
                if out.status.success() {
                    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
                    candidates.push(PathBuf::from(dir));
                }
            }
        }
        let mut tried = Vec::new();
        for dir in candidates {
            let postgres = dir.join("postgres");
            match Command::new(&postgres).arg("--version").output() {
                Ok(out) if out.status.success() => {
                    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
                    // "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"
                    let major = version
                        .split_whitespace()
                        .nth(2)
                        .and_then(|v| v.split('.').next())
                        .unwrap_or("");
                    if major == PG_MAJOR {
                        return Ok(PgBin { dir });
                    }
                    tried.push(format!("{}: {version}", postgres.display()));
                }
                _ => tried.push(format!("{}: not found", postgres.display())),
            }
        }
        Err(format!(
            "PostgreSQL 15 is missing (tried {}). {INSTALL_HINT}",
            tried.join("; ")
        ))
    }

    /// [`PgBin::find`], panicking with install instructions when PostgreSQL 15 is missing.
    pub fn require() -> PgBin {
        PgBin::find().unwrap_or_else(|e| panic!("{e}"))
    }

    /// The path of one of PostgreSQL's programs (`initdb`, `pg_ctl`, `psql`,
    /// `pg_receivewal`, `pg_basebackup`, `pg_waldump`, ...).
    pub fn tool(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A command for a server-side program, run as `postgres` when we are root.
    pub fn server_command(&self, name: &str) -> Command {
        let program = self.tool(name);
        if is_root() {
            let mut c = Command::new("runuser");
            c.arg("-u").arg("postgres").arg("--").arg(program);
            c
        } else {
            Command::new(program)
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `cmd` and panics with its output if it fails.
fn run(mut cmd: Command, what: &str) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{what} failed ({}): {cmd:?}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// A free loopback TCP port: bind port 0 and let the kernel pick. The port is released
/// before the server binds it, so another process could take it in between; on this
/// machine's loopback that race is rare enough for tests. A released port may also be the
/// kernel's next pick, so ports already given out by this process are never given again.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    for _ in 0..64 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("bind a loopback port");
        let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
    panic!("64 probes for a free loopback port found only ports already given out")
}

/// A temporary directory for a cluster, owned by `postgres` when we are root.
fn cluster_dir(prefix: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("create a temporary directory");
    if is_root() {
        let mut chown = Command::new("chown");
        chown.arg("postgres:postgres").arg(dir.path());
        run(chown, "chown the cluster directory to postgres");
    }
    dir
}

/// How to set up a cluster.
#[derive(Clone, Debug, Default)]
pub struct PgOptions {
    /// Extra `postgresql.conf` lines, after the defaults (so they win).
    pub conf: Vec<String>,
    /// `pg_hba.conf` lines, after two that let the `postgres` superuser in over loopback
    /// without a password (for [`PgCluster::psql`]).
    pub hba: Vec<String>,
    /// Files to write into the data directory before the server starts (certificates and
    /// keys for `ssl = on`, say), readable only by the server's user.
    pub files: Vec<(String, Vec<u8>)>,
    /// For [`PgCluster::init_standby`]: stream from this upstream instead of the cluster the
    /// base backup was taken from (a libpq connection string; a walserver standby, say).
    pub primary_conninfo: Option<String>,
}

impl PgOptions {
    pub fn conf(mut self, line: impl Into<String>) -> PgOptions {
        self.conf.push(line.into());
        self
    }

    pub fn hba(mut self, line: impl Into<String>) -> PgOptions {
        self.hba.push(line.into());
        self
    }

    pub fn file(mut self, name: impl Into<String>, contents: impl Into<Vec<u8>>) -> PgOptions {
        self.files.push((name.into(), contents.into()));
        self
    }

    /// `ssl = on` with `pki`'s certificate and key (written into the data directory).
    pub fn tls(self, pki: &TestPki) -> PgOptions {
        self.file("server.crt", pki.cert_pem.as_bytes())
            .file("server.key", pki.key_pem.as_bytes())
            .conf("ssl = on")
            .conf("ssl_cert_file = 'server.crt'")
            .conf("ssl_key_file = 'server.key'")
    }

    pub fn primary_conninfo(mut self, conninfo: impl Into<String>) -> PgOptions {
        self.primary_conninfo = Some(conninfo.into());
        self
    }
}

/// A running PostgreSQL 15 cluster in a temporary directory, listening on
/// `127.0.0.1:port()` (no Unix socket). Dropping it stops the server (fast mode) and
/// removes the directory.
pub struct PgCluster {
    bin: PgBin,
    dir: tempfile::TempDir,
    port: u16,
    running: bool,
}

impl PgCluster {
    /// initdb, configure and start a primary with `wal_level=replica`,
    /// `max_wal_senders=10`, `password_encryption=scram-sha-256`,
    /// `log_replication_commands=on` and `fsync=off` (the data is thrown away; a line in
    /// `opts.conf` overrides any of these).
    pub fn init_primary(opts: &PgOptions) -> PgCluster {
        let cluster = PgCluster::new_dir();
        let mut initdb = cluster.bin.server_command("initdb");
        initdb.arg("-D").arg(cluster.data_dir()).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "-N",
        ]);
        run(initdb, "initdb");

        let mut conf = vec![
            format!("port = {}", cluster.port),
            "listen_addresses = '127.0.0.1'".to_string(),
            "unix_socket_directories = ''".to_string(),
            "wal_level = replica".to_string(),
            "max_wal_senders = 10".to_string(),
            "password_encryption = 'scram-sha-256'".to_string(),
            "fsync = off".to_string(),
            "log_replication_commands = on".to_string(),
        ];
        conf.extend(opts.conf.iter().cloned());
        cluster.append_file("postgresql.conf", &conf);
        cluster.write_hba(opts);
        cluster.write_files(opts);

        let mut cluster = cluster;
        cluster.start();
        cluster
    }

    /// A standby of `primary`: `pg_basebackup -R` (which writes `standby.signal` and a
    /// `primary_conninfo` pointing at `primary`), then the standby's own port and `opts`,
    /// then started. `primary_conninfo`, when given, replaces the one pg_basebackup wrote,
    /// so the standby can stream from somewhere else (a walserver) while its data came from
    /// `primary`.
    pub fn init_standby_from(
        primary: &PgCluster,
        primary_conninfo: Option<&str>,
        opts: &PgOptions,
    ) -> PgCluster {
        let mut cluster = PgCluster::new_dir();
        let mut backup = cluster.bin.server_command("pg_basebackup");
        backup
            .arg("-D")
            .arg(cluster.data_dir())
            .args(["-h", primary.host(), "-U", "postgres", "-X", "stream", "-R"])
            .args(["--checkpoint=fast", "-p"])
            .arg(primary.port.to_string());
        run(backup, "pg_basebackup");
        let mut conf = vec![format!("port = {}", cluster.port)];
        conf.extend(opts.conf.iter().cloned());
        cluster.append_file("postgresql.conf", &conf);
        cluster.write_hba(opts);
        cluster.write_files(opts);
        if let Some(ci) = primary_conninfo {
            cluster.append_file(
                "postgresql.auto.conf",
                &[format!("primary_conninfo = '{}'", ci.replace('\'', "''"))],
            );
        }
        cluster.start();
        cluster
    }

    /// A fresh directory owned by the server's user, and a free port.
    fn new_dir() -> PgCluster {
        PgCluster {
            bin: PgBin::require(),
            dir: cluster_dir("pg-testkit-"),
            port: free_port(),
            running: false,
        }
    }

    /// Writes `opts.files` into the data directory with mode 0600, owned by the server's
    /// user (PostgreSQL refuses a private key others can read).
    fn write_files(&self, opts: &PgOptions) {
        use std::os::unix::fs::PermissionsExt;
        for (name, contents) in &opts.files {
            let path = self.data_dir().join(name);
            fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod 0600");
            if is_root() {
                let mut chown = Command::new("chown");
                chown.arg("postgres:postgres").arg(&path);
                run(chown, "chown a data directory file to postgres");
            }
        }
    }

    fn write_hba(&self, opts: &PgOptions) {
        let mut hba = vec![
            "host all postgres 127.0.0.1/32 trust".to_string(),
            "host replication postgres 127.0.0.1/32 trust".to_string(),
        ];
        hba.extend(opts.hba.iter().cloned());
        self.write_file("pg_hba.conf", &hba);
    }

    /// Runs `sql` until its output is `expected` or `timeout` passes, and says whether it got
    /// there. For waiting on the server's own progress (a standby catching up), the one
    /// place where polling an external process with a deadline is the only way to know.
    pub fn wait_for(&self, sql: &str, expected: &str, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if self.psql(sql) == expected {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// A hot standby of this cluster: pg_basebackup (as the `postgres` superuser, with the WAL
    /// streamed alongside and `-R` writing `standby.signal` and `primary_conninfo`), on a port
    /// of its own, started. Its configuration and access rules are this cluster's, plus
    /// `opts`; `opts.primary_conninfo` points it at another upstream.
    pub fn init_standby(&self, opts: &PgOptions) -> PgCluster {
        let standby = PgCluster {
            bin: self.bin.clone(),
            dir: cluster_dir("pg-testkit-standby-"),
            port: free_port(),
            running: false,
        };
        self.pg_basebackup(&standby.data_dir(), &["-X", "stream", "-R", "-c", "fast"]);
        let mut conf = vec![format!("port = {}", standby.port)];
        conf.extend(opts.conf.iter().cloned());
        standby.append_file("postgresql.conf", &conf);
        standby.append_file("pg_hba.conf", &opts.hba);
        if let Some(conninfo) = &opts.primary_conninfo {
            // After the line `-R` wrote in postgresql.auto.conf, which is read last: this wins.
            standby.append_file(
                "postgresql.auto.conf",
                &[format!(
                    "primary_conninfo = '{}'",
                    conninfo.replace('\\', "\\\\").replace('\'', "''")
                )],
            );
        }
        let mut standby = standby;
        standby.start();
        standby
    }

    /// A base backup of this cluster without its WAL (`pg_basebackup -X none`, a fast
    /// checkpoint): a server made from it needs the WAL from the backup's start onwards
    /// from an archive ([`PgCluster::recover_from`]).
    pub fn base_backup(&self) -> BaseBackup {
        let backup = BaseBackup {
            dir: cluster_dir("pg-testkit-backup-"),
        };
        self.pg_basebackup(&backup.data_dir(), &["-X", "none", "-c", "fast"]);
        backup
    }

    /// Runs `pg_basebackup` of this cluster into `dir` as the `postgres` superuser, with `args`.
    fn pg_basebackup(&self, dir: &Path, args: &[&str]) {
        let mut cmd = self.bin.server_command("pg_basebackup");
        cmd.arg("-D")
            .arg(dir)
            .args(["-h", self.host(), "-U", "postgres", "-p"])
            .arg(self.port.to_string())
            .args(args);
        run(cmd, "pg_basebackup");
    }

    /// A server restored from a copy of `backup` by archive recovery: `recovery.signal`, a
    /// port of its own, then `opts.conf` (which gives `restore_command` and the recovery
    /// target), started. `pg_ctl start -w` returns once it accepts connections, which may be
    /// before recovery ends; wait for `pg_is_in_recovery()` to say so.
    pub fn recover_from(backup: &BaseBackup, opts: &PgOptions) -> PgCluster {
        let cluster = PgCluster::new_dir();
        // `cp -a` keeps the files the server's user's.
        let mut cp = Command::new("cp");
        cp.arg("-a").arg(backup.data_dir()).arg(cluster.data_dir());
        run(cp, "copy the base backup");
        let mut conf = vec![format!("port = {}", cluster.port)];
        conf.extend(opts.conf.iter().cloned());
        cluster.append_file("postgresql.conf", &conf);
        cluster.write_file("recovery.signal", &[]);
        let mut cluster = cluster;
        cluster.start();
        cluster
    }

    /// Promotes a standby and waits until it accepts writes (`pg_ctl promote -w`).
    pub fn promote(&self) {
        let mut cmd = self.bin.server_command("pg_ctl");
        cmd.arg("-D")
            .arg(self.data_dir())
            .args(["-w", "-t", "60", "promote"]);
        run(cmd, "pg_ctl promote");
    }

    fn append_file(&self, name: &str, lines: &[String]) {
        let path = self.data_dir().join(name);
        let mut text = fs::read_to_string(&path).unwrap_or_default();
        text.push('\n');
        for l in lines {
            text.push_str(l);
            text.push('\n');
        }
        fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    fn write_file(&self, name: &str, lines: &[String]) {
        let path = self.data_dir().join(name);
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// Starts the server and waits until it accepts connections (`pg_ctl start -w`, which
    /// watches the postmaster's readiness report, bounded at 60 s).
    pub fn start(&mut self) {
        let mut cmd = self.bin.server_command("pg_ctl");
        cmd.arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.log_path())
            .args(["-w", "-t", "60", "start"]);
        let out = cmd.output().expect("run pg_ctl start");
        if !out.status.success() {
            panic!(
                "pg_ctl start failed: {}\n{}\nserver log:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.log()
            );
        }
        self.running = true;
    }

    /// Stops the server in fast mode and waits for it to exit.
    pub fn stop(&mut self) {
        if !self.running {
            return;
        }
        let mut cmd = self.bin.server_command("pg_ctl");
        cmd.arg("-D")
            .arg(self.data_dir())
            .args(["-m", "fast", "-w", "-t", "60", "stop"]);
        run(cmd, "pg_ctl stop");
        self.running = false;
    }

    pub fn bin(&self) -> &PgBin {
        &self.bin
    }

    pub fn host(&self) -> &'static str {
        "127.0.0.1"
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The data directory (PGDATA).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// The server log so far, for failure messages.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Runs SQL as the `postgres` superuser through psql and returns its unaligned, tuples-only
    /// output, trimmed. Panics (with the server log) if psql fails.
    pub fn psql(&self, sql: &str) -> String {
        let mut cmd = Command::new(self.bin.tool("psql"));
        cmd.args([
            "-X",
            "-A",
            "-t",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            self.host(),
        ])
        .arg("-p")
        .arg(self.port.to_string())
        .args(["-U", "postgres", "-d", "postgres", "-c", sql])
        .env_remove("PGPASSWORD")
        .env_remove("PGSERVICE");
        let out = cmd.output().expect("run psql");
        if !out.status.success() {
            panic!(
                "psql {sql:?} failed: {}\nserver log:\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.log()
            );
        }
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Creates a login role with the REPLICATION attribute whose password is stored with
    /// `encryption` (`scram-sha-256` or `md5`).
    pub fn create_replication_role(&self, name: &str, password: &str, encryption: &str) {
        self.psql(&format!(
            "SET password_encryption = '{encryption}'; \
             CREATE ROLE \"{name}\" LOGIN REPLICATION PASSWORD '{}'",
            password.replace('\'', "''")
        ));
    }

    /// A libpq connection string for this cluster.
    pub fn conninfo(&self, user: &str, password: Option<&str>) -> String {
        let mut s = format!("host={} port={} user={user}", self.host(), self.port);
        if let Some(p) = password {
            s.push_str(&format!(" password={p}"));
        }
        s
    }
}

/// A base backup in a temporary directory owned by the server's user, removed on drop.
pub struct BaseBackup {
    dir: tempfile::TempDir,
}

impl BaseBackup {
    /// The backup's data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.running {
            let mut cmd = self.bin.server_command("pg_ctl");
            cmd.arg("-D")
                .arg(self.data_dir())
                .args(["-m", "immediate", "-w", "-t", "60", "stop"]);
            // Errors cannot be reported from drop; the directory goes away regardless.
            let _ = cmd.output();
            self.running = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_postgresql_15() {
        let bin = PgBin::require();
        for tool in [
            "initdb",
            "pg_ctl",
            "postgres",
            "psql",
            "pg_receivewal",
            "pg_basebackup",
            "pg_waldump",
        ] {
            assert!(
                bin.tool(tool).exists(),
                "{tool} missing in {}",
                bin.dir().display()
            );
        }
    }

    #[test]
    fn missing_binaries_fail_with_install_hint() {
        // An explicit WALSERVER_PG_BIN is the only place looked at, so a wrong one must fail.
        let text = match PgBin::find_in(Some(PathBuf::from("/nonexistent/pg/bin"))) {
            Ok(bin) => panic!("accepted {} without PostgreSQL in it", bin.dir().display()),
            Err(text) => text,
        };
        assert!(text.contains("PostgreSQL 15 is missing"), "{text}");
        assert!(text.contains("/nonexistent/pg/bin/postgres"), "{text}");
        assert!(text.contains("apt-get install postgresql-15"), "{text}");
    }

    #[test]
    fn a_standby_streams_and_promotes() {
        let primary = PgCluster::init_primary(&PgOptions::default());
        primary.psql("CREATE TABLE t AS SELECT 1 AS x");
        let standby = primary.init_standby(&PgOptions::default());
        assert_eq!(standby.psql("SELECT pg_is_in_recovery()"), "t");
        assert_eq!(standby.psql("SELECT count(*) FROM t"), "1");
        standby.promote();
        assert_eq!(standby.psql("SELECT pg_is_in_recovery()"), "f");
        assert_eq!(
            standby.psql("SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)"),
            "00000002"
        );
    }

    #[test]
    fn cluster_starts_answers_and_cleans_up() {
        let mut pg = PgCluster::init_primary(&PgOptions::default().conf("wal_keep_size = '16MB'"));
        assert_eq!(pg.psql("SHOW wal_level"), "replica");
        assert_eq!(pg.psql("SHOW wal_keep_size"), "16MB");
        assert!(pg.psql("SELECT version()").contains("PostgreSQL 15"));
        pg.create_replication_role("r1", "pw", "md5");
        assert!(pg
            .psql("SELECT rolpassword FROM pg_authid WHERE rolname = 'r1'")
            .starts_with("md5"));
        let dir = pg.data_dir();
        pg.stop();
        assert!(std::net::TcpStream::connect(pg.addr()).is_err());
        pg.start();
        assert_eq!(pg.psql("SELECT 1"), "1");
        drop(pg);
        assert!(!dir.exists());
    }

    #[test]
    fn standby_streams_from_primary() {
        let primary = PgCluster::init_primary(&PgOptions::default());
        let standby = PgCluster::init_standby_from(
            &primary,
            Some(&format!(
                "host=127.0.0.1 port={} user=postgres application_name=testkit_standby",
                primary.port()
            )),
            &PgOptions::default(),
        );
        assert_eq!(standby.psql("SELECT pg_is_in_recovery()"), "t");
        primary.psql("CREATE TABLE t AS SELECT generate_series(1, 100) AS i");
        let timeout = std::time::Duration::from_secs(60);
        assert!(
            standby.wait_for(
                "SELECT count(*) FROM pg_class WHERE relname = 't'",
                "1",
                timeout
            ),
            "standby never saw the table:\n{}",
            standby.log()
        );
        assert_eq!(standby.psql("SELECT count(*) FROM t"), "100");
        assert!(primary.wait_for(
            "SELECT application_name FROM pg_stat_replication",
            "testkit_standby",
            timeout
        ));
    }
}
