//! Link faults between hosts of a [`Net`](crate::netns::Net), made with nftables and tc inside
//! the hosts' namespaces. Packets are dropped where they arrive (the receiving host's `input`
//! hook), so the sender sees what a real lost packet looks like: nothing, rather than an error
//! from its own stack. Each fault is a guard: [`Fault::heal`] (or dropping it) removes it.
//!
//! This kernel's tc lacks netem; delay and jitter come from [`crate::proxy`] instead.

use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::netns::{run_cmd, Host};
use crate::{Error, Result};

/// The nftables table every fault's chains live in, inside a host's namespace.
const TABLE: &str = "inet wsfault";

static NEXT_CHAIN: AtomicU64 = AtomicU64::new(0);

fn nft(host: &Host, script: &str) -> Result<()> {
    let mut child = host
        .command("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Io {
            what: "run nft".into(),
            source: e,
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes()).map_err(|e| Error::Io {
            what: "write nft's script".into(),
            source: e,
        })?;
    }
    let out = child.wait_with_output().map_err(|e| Error::Io {
        what: "wait for nft".into(),
        source: e,
    })?;
    if !out.status.success() {
        return Err(Error::Command {
            command: format!("nft -f - <<{script:?}"),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// What a fault changed, so that healing undoes exactly that.
#[derive(Debug)]
enum Undo {
    /// nft chains (each a base chain of its own) in `host`'s namespace.
    Chains { host: Host, chains: Vec<String> },
    /// The root qdisc of `host`'s `eth0`.
    Qdisc { host: Host },
}

/// A fault in place; removed by [`Fault::heal`] or on drop.
#[must_use = "a fault is removed when its guard is dropped"]
#[derive(Debug)]
pub struct Fault {
    what: String,
    undo: Vec<Undo>,
}

impl Fault {
    /// What the fault is, in a few words.
    pub fn describe(&self) -> &str {
        &self.what
    }

    /// Removes the fault now; an error if a tool failed.
    pub fn heal(mut self) -> Result<()> {
        self.undo_all()
    }

    fn undo_all(&mut self) -> Result<()> {
        let mut first = Ok(());
        for u in self.undo.drain(..) {
            let r = match u {
                Undo::Chains { host, chains } => {
                    let script: String = chains
                        .iter()
                        .map(|c| format!("flush chain {TABLE} {c}\ndelete chain {TABLE} {c}\n"))
                        .collect();
                    nft(&host, &script)
                }
                Undo::Qdisc { host } => host
                    .exec("tc", &["qdisc", "del", "dev", "eth0", "root"])
                    .map(|_| ()),
            };
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Both faults as one guard.
    pub fn and(mut self, mut other: Fault) -> Fault {
        self.what = format!("{} and {}", self.what, other.what);
        self.undo.append(&mut other.undo);
        self
    }
}

impl Drop for Fault {
    fn drop(&mut self) {
        let _ = self.undo_all();
    }
}

/// Adds a base chain on `hook` in `host` holding `rule`.
fn chain_rule(host: &Host, hook: &str, rule: &str) -> Result<String> {
    let chain = format!("f{}{hook}", NEXT_CHAIN.fetch_add(1, Ordering::Relaxed));
    nft(
        host,
        &format!(
            "add table {TABLE}\n\
             add chain {TABLE} {chain} {{ type filter hook {hook} priority 0; policy accept; }}\n\
             add rule {TABLE} {chain} {rule}\n"
        ),
    )?;
    Ok(chain)
}

fn input_drop(from: Ipv4Addr, to: &Host, loss_percent: u8) -> Result<Fault> {
    if loss_percent == 0 || loss_percent > 100 {
        return Err(Error::Invalid(format!(
            "a loss of {loss_percent}%: expected 1 to 100"
        )));
    }
    let rule = if loss_percent == 100 {
        format!("ip saddr {from} drop")
    } else {
        format!("ip saddr {from} numgen random mod 100 < {loss_percent} drop")
    };
    let chain = chain_rule(to, "input", &rule)?;
    Ok(Fault {
        what: if loss_percent == 100 {
            format!("{from} -> {} dropped", to.name)
        } else {
            format!("{loss_percent}% of {from} -> {} lost", to.name)
        },
        undo: vec![Undo::Chains {
            host: to.clone(),
            chains: vec![chain],
        }],
    })
}

/// Drops every packet from `from` to `to` (one way: `to`'s packets still reach `from`).
pub fn drop_one_way(from: &Host, to: &Host) -> Result<Fault> {
    input_drop(from.addr, to, 100)
}

/// Cuts the link between `a` and `b` both ways.
pub fn cut(a: &Host, b: &Host) -> Result<Fault> {
    Ok(drop_one_way(a, b)?.and(drop_one_way(b, a)?))
}

/// Cuts the TCP traffic of `ports` between `a` and `b` both ways (a connection to one of the
/// ports on either side, and its answers), leaving every other port open: etcd's ports cut
/// while replication flows.
pub fn cut_ports(a: &Host, b: &Host, ports: &[u16]) -> Result<Fault> {
    if ports.is_empty() {
        return Err(Error::Invalid("no ports to cut".into()));
    }
    let set = ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let mut undo = Vec::new();
    for (to, from) in [(a, b), (b, a)] {
        // Where the packets arrive: to a port of the set (a request) and from one (an answer).
        let dport = chain_rule(
            to,
            "input",
            &format!("ip saddr {} tcp dport {{ {set} }} drop", from.addr),
        )?;
        let sport = chain_rule(
            to,
            "input",
            &format!("ip saddr {} tcp sport {{ {set} }} drop", from.addr),
        )?;
        undo.push(Undo::Chains {
            host: to.clone(),
            chains: vec![dport, sport],
        });
    }
    Ok(Fault {
        what: format!("ports {set} cut between {} and {}", a.name, b.name),
        undo,
    })
}

/// Cuts `host` off from every other host of its network both ways (its loopback still works).
pub fn isolate(host: &Host) -> Result<Fault> {
    let input = chain_rule(host, "input", "iifname \"eth0\" drop")?;
    let output = chain_rule(host, "output", "oifname \"eth0\" drop")?;
    Ok(Fault {
        what: format!("{} isolated", host.name),
        undo: vec![Undo::Chains {
            host: host.clone(),
            chains: vec![input, output],
        }],
    })
}

/// Drops a random `percent` of the packets from `from` to `to` (nft's `numgen random`).
pub fn loss(from: &Host, to: &Host, percent: u8) -> Result<Fault> {
    input_drop(from.addr, to, percent)
}

/// Caps what `host` sends on `eth0` to `kbit` kilobits per second (tc's token bucket filter).
pub fn bandwidth(host: &Host, kbit: u32) -> Result<Fault> {
    // A burst of 32 kB and a queue of up to 500 ms: guesses that let a TCP stream reach the
    // rate without the queue dropping most of a window.
    run_cmd(host.command("tc").args([
        "qdisc",
        "replace",
        "dev",
        "eth0",
        "root",
        "tbf",
        "rate",
        &format!("{kbit}kbit"),
        "burst",
        "32kb",
        "latency",
        "500ms",
    ]))?;
    Ok(Fault {
        what: format!("{} capped at {kbit} kbit/s", host.name),
        undo: vec![Undo::Qdisc { host: host.clone() }],
    })
}

/// Whether the tools the faults need are installed (nft, tc, ip), for a clear failure.
pub fn check_tools() -> Result<()> {
    for tool in ["nft", "tc", "ip"] {
        run_cmd(Command::new(tool).arg(if tool == "nft" { "--version" } else { "-V" })).map_err(
            |e| {
                Error::Invalid(format!(
                    "{tool} is needed for the fault tests ({e}); install nftables and iproute2"
                ))
            },
        )?;
    }
    Ok(())
}
