//! The demo's automatic failover part: one etcd and three `walserver run` processes with a
//! `[failover]` table, all on loopback ports in the demo's temporary directory. The primary
//! takes the leader key, the two standbys follow it; the primary is killed (SIGKILL, so it
//! releases nothing), and the demo shows which standby took over, how long after the kill it
//! acknowledged appends again, and the other standby following it.
//!
//! The nodes are child processes, not actors in the demo's own process, so that the kill is
//! a real one. Their logs are files in the temporary directory, shown when a step fails.
//! Without an etcd executable the part is skipped with a word on how to get one.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;
use walserver_node::admin::{get_json, AdminClient};
use walserver_node::init;

/// The leader key's lease in the demo: short, so the failover is quick to watch. The dead
/// primary is replaced about this long after it dies.
const TTL_SECS: u64 = 3;

/// How long each step may take before the demo gives up. A guess for two busy cores: every
/// step takes well under a second but the failover, which takes about the ttl.
const STEP_DEADLINE: Duration = Duration::from_secs(30);

/// The demo's pause between two looks at a node's admin API while it waits for a change
/// (the nodes are other processes: the API is the only way to ask them).
const LOOK_INTERVAL: Duration = Duration::from_millis(20);

/// How the demo tells people to get etcd.
pub const ETCD_HINT: &str = "install etcd to see automatic failover too: `apt-get install etcd-server` on Debian/Ubuntu, or run ./scripts/test.sh, which installs it";

/// The etcd executable: `etcd` on `PATH`, else `/usr/bin/etcd`.
pub fn find_etcd() -> Option<PathBuf> {
    find_etcd_in(std::env::var_os("PATH"), Path::new("/usr/bin/etcd"))
}

fn find_etcd_in(path: Option<std::ffi::OsString>, fallback: &Path) -> Option<PathBuf> {
    path.iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("etcd"))
        .chain([fallback.to_path_buf()])
        .find(|p| p.is_file())
}

/// The processes the part started, killed and reaped when it ends however it ends.
struct Processes {
    children: Vec<(String, Child, PathBuf)>,
}

impl Processes {
    fn spawn(&mut self, name: &str, cmd: &mut Command, log: PathBuf) -> anyhow::Result<()> {
        let file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let child = cmd
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        self.children.push((name.to_string(), child, log));
        Ok(())
    }

    /// Kills `name` at once (SIGKILL) and reaps it.
    fn kill(&mut self, name: &str) {
        if let Some((_, c, _)) = self.children.iter_mut().find(|(n, _, _)| n == name) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The end of every log, for a failure message.
    fn logs(&self) -> String {
        let mut out = String::new();
        for (name, _, log) in &self.children {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(15)..];
            out.push_str(&format!(
                "--- {name} ({})\n{}\n",
                log.display(),
                tail.join("\n")
            ));
        }
        out
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, c, _) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `N` distinct free loopback ports. All are bound at once, so the kernel cannot pick one twice,
/// then released for etcd and the nodes to bind; another process could take one in between,
/// which on loopback is rare enough for a demo.
fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()
        .context("cannot bind a loopback port")?;
    let mut ports = [0; N];
    for (port, l) in ports.iter_mut().zip(&listeners) {
        *port = l.local_addr()?.port();
    }
    Ok(ports)
}

/// One of the demo's failover nodes.
struct FoNode {
    name: &'static str,
    listen: u16,
    http: String,
}

/// Waits until `probe` answers `Some`, looking every [`LOOK_INTERVAL`], for at most
/// [`STEP_DEADLINE`]; `what` names the wait in the error.
fn wait_for<T>(
    procs: &Processes,
    what: &str,
    mut probe: impl FnMut() -> Option<T>,
) -> anyhow::Result<T> {
    let start = Instant::now();
    let max_looks = STEP_DEADLINE.as_millis() / LOOK_INTERVAL.as_millis() + 1;
    for _ in 0..max_looks {
        if let Some(v) = probe() {
            return Ok(v);
        }
        if start.elapsed() > STEP_DEADLINE {
            break;
        }
        std::thread::sleep(LOOK_INTERVAL);
    }
    bail!("timed out waiting for {what}; the logs:\n{}", procs.logs())
}

/// The HTTP status of `GET path` (0 when the node does not answer).
fn status_of(client: &AdminClient, path: &str) -> u16 {
    client
        .get(path)
        .call()
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// Runs the part in `dir`. Must be called outside any async runtime (it blocks).
pub fn run(dir: &Path, etcd: &Path) -> anyhow::Result<()> {
    let dir = dir.join("failover");
    std::fs::create_dir_all(&dir)?;
    let mut procs = Processes {
        children: Vec::new(),
    };
    let [client_port, peer_port, ports @ ..] = free_ports::<8>()?;
    let etcd_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    procs.spawn(
        "etcd",
        Command::new(etcd)
            .arg("--name=demo")
            .arg(format!("--data-dir={}", dir.join("etcd").display()))
            .arg(format!("--listen-client-urls={etcd_url}"))
            .arg(format!("--advertise-client-urls={etcd_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=demo={peer_url}"))
            // One member is its own quorum: short raft timeouts cost nothing and let etcd
            // take a lease of a few seconds.
            .arg("--heartbeat-interval=25")
            .arg("--election-timeout=250"),
        dir.join("etcd.log"),
    )?;
    wait_for(&procs, "etcd to answer", || {
        get_json(&etcd_url, "/health", None)
            .ok()
            .filter(|v| v["health"] == "true")
    })?;
    println!("etcd      {etcd_url}  ({})", etcd.display());

    let exe = std::env::current_exe().context("cannot find the walserver executable")?;
    let nodes: Vec<FoNode> = ["f1", "f2", "f3"]
        .into_iter()
        .zip(ports.chunks_exact(2))
        .map(|(name, pair)| FoNode {
            name,
            listen: pair[0],
            http: format!("127.0.0.1:{}", pair[1]),
        })
        .collect();
    let start_node = |procs: &mut Processes, n: &FoNode| -> anyhow::Result<()> {
        let config = dir.join(format!("{}.toml", n.name));
        std::fs::write(
            &config,
            format!(
                "data_dir = {:?}\nlisten = \"127.0.0.1:{}\"\nhttp_listen = \"{}\"\nwal_keep_size = \"256MB\"\n\
                 [failover]\netcd_endpoints = \"{etcd_url}\"\ncluster_name = \"demo\"\nnode_name = \"{}\"\nttl = \"{TTL_SECS}s\"\n",
                dir.join(n.name).display().to_string(),
                n.listen,
                n.http,
                n.name
            ),
        )?;
        procs.spawn(
            n.name,
            Command::new(&exe)
                .arg("run")
                .arg("--config")
                .arg(&config)
                .env("NO_COLOR", "1")
                .env_remove("RUST_LOG"),
            dir.join(format!("{}.log", n.name)),
        )
    };
    let clients: Vec<AdminClient> = nodes
        .iter()
        .map(|n| AdminClient::with_timeout(&n.http, None, Some(Duration::from_secs(2))))
        .collect();

    init::init_primary(&dir.join("f1"), 16 << 20)?;
    start_node(&mut procs, &nodes[0])?;
    wait_for(&procs, "f1 to take the leader key", || {
        (status_of(&clients[0], "/primary") == 200).then_some(())
    })?;
    println!("f1        took the leader key (GET /primary answers 200)");
    for n in &nodes[1..] {
        let conninfo = format!(
            "host=127.0.0.1 port={} user=walserver application_name={}",
            nodes[0].listen, n.name
        );
        init::init_standby(&dir.join(n.name), &conninfo, None, None)?;
        start_node(&mut procs, n)?;
    }
    for (n, c) in nodes.iter().zip(&clients).skip(1) {
        wait_for(&procs, &format!("{} to stream", n.name), || {
            (status_of(c, "/replica") == 200).then_some(())
        })?;
    }
    // The members' keys say streaming once each standby has refreshed its own.
    let list = wait_for(&procs, "both standbys to be listed as streaming", || {
        let v = get_json(&nodes[0].http, "/cluster", None).ok()?;
        let streaming = v["members"]
            .as_array()?
            .iter()
            .filter(|m| m["role"] == "standby" && m["streaming"] == true)
            .count();
        (streaming == 2).then_some(v)
    })?;
    println!(
        "\n`walserver cluster list --http {}`:\n{}",
        nodes[0].http,
        crate::cluster::render_cluster(&list)?
    );

    // Appends on the leader, acknowledged.
    let append = |c: &AdminClient| -> Option<Value> {
        let mut resp = c
            .post("/wal", "application/octet-stream")
            .send(&b"a record appended under automatic failover"[..])
            .ok()?;
        if resp.status().as_u16() != 200 {
            return None;
        }
        serde_json::from_str(&resp.body_mut().read_to_string().ok()?).ok()
    };
    for _ in 0..100 {
        append(&clients[0]).context("an append on f1 was refused")?;
    }

    // The primary dies without a word: its lease runs out in etcd, a standby takes the key.
    println!("killing f1 (SIGKILL) ...");
    let killed = Instant::now();
    procs.kill("f1");
    let (winner, first) = wait_for(
        &procs,
        "a standby to take over and acknowledge an append",
        || (1..3).find_map(|i| append(&clients[i]).map(|a| (i, a))),
    )?;
    let took = killed.elapsed();
    let new = &nodes[winner];
    println!(
        "{} was promoted: it acknowledged appends again {:.1} s after the kill (ttl {TTL_SECS} s), timeline {}, end LSN {}",
        new.name,
        took.as_secs_f64(),
        first["timeline"],
        first["end_lsn"].as_str().unwrap_or("?")
    );
    let other = 3 - winner;
    let end = append(&clients[winner]).context("an append on the new leader")?;
    let end_lsn = end["end_lsn"].as_str().unwrap_or_default().to_string();
    wait_for(
        &procs,
        &format!("{} to follow {}", nodes[other].name, new.name),
        || {
            let s = get_json(&nodes[other].http, "/status", None).ok()?;
            let flushed: wal_storage::Lsn = s["flush_lsn"].as_str()?.parse().ok()?;
            let want: wal_storage::Lsn = end_lsn.parse().ok()?;
            (flushed >= want && status_of(&clients[other], "/replica") == 200).then_some(())
        },
    )?;
    println!(
        "{} follows {}: streaming, flushed through {end_lsn}",
        nodes[other].name, new.name
    );
    let timeline = first["timeline"].clone();
    let list = wait_for(
        &procs,
        &format!(
            "{}'s member key to say it streams on the new timeline",
            nodes[other].name
        ),
        || {
            let v = get_json(&new.http, "/cluster", None).ok()?;
            let listed = v["members"].as_array()?.iter().any(|m| {
                m["name"] == nodes[other].name
                    && m["streaming"] == true
                    && m["timeline"] == timeline
            });
            listed.then_some(v)
        },
    )?;
    println!(
        "\n`walserver cluster list --http {}` (f1's member key went with its lease):\n{}",
        new.http,
        crate::cluster::render_cluster(&list)?
    );
    if let Ok(h) = get_json(&new.http, "/history", None) {
        println!(
            "`walserver cluster history`:\n{}",
            crate::cluster::render_history(&h)?
        );
    }
    println!(
        "  automatic failover: {} took over from the killed f1 in {:.1} s; appends resumed there",
        new.name,
        took.as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_is_found_on_path_then_at_the_fallback_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let (on_path, elsewhere) = (dir.path().join("bin"), dir.path().join("other"));
        std::fs::create_dir_all(&on_path).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        let fallback = elsewhere.join("etcd");
        let path = Some(on_path.clone().into_os_string());
        assert_eq!(find_etcd_in(path.clone(), &fallback), None);
        std::fs::write(&fallback, "").unwrap();
        assert_eq!(
            find_etcd_in(path.clone(), &fallback),
            Some(fallback.clone())
        );
        std::fs::write(on_path.join("etcd"), "").unwrap();
        assert_eq!(find_etcd_in(path, &fallback), Some(on_path.join("etcd")));
        assert_eq!(find_etcd_in(None, &dir.path().join("none")), None);
    }
}
