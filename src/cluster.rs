//! `walserver cluster`: the failover cluster through one member's admin API. `list` and
//! `history` read `/cluster` and `/history` (a table, or the JSON as the API gives it with
//! `--json`); `switchover`, `failover`, `pause` and `resume` post to the endpoints of the
//! same names and say what happened; `slots add|remove NAME` to `/cluster/slots/add|remove`.

use anyhow::bail;
use serde_json::Value;
use walserver_node::admin::{get_json, post_json};
use walserver_node::units::format_size;

/// Where the admin API is, and its token.
#[derive(clap::Args, Clone, Debug)]
pub struct Target {
    /// The admin API address of any member.
    #[arg(long, default_value = "127.0.0.1:8433")]
    pub http: String,
    /// Bearer token, if the API requires one (or WALSERVER_HTTP_AUTH_TOKEN).
    #[arg(long, env = "WALSERVER_HTTP_AUTH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

#[derive(clap::Subcommand, Clone, Debug)]
pub enum ClusterCommand {
    /// The members, their roles and lags, and who holds the leader key.
    List {
        #[command(flatten)]
        target: Target,
        /// Print `/cluster`'s JSON as the API gives it.
        #[arg(long)]
        json: bool,
    },
    /// A planned change of leader with no loss: appends pause, the candidate (or the best
    /// standby) catches up, the leader key is handed over.
    Switchover {
        #[command(flatten)]
        target: Target,
        /// The member to hand the leadership to; default: the best standby.
        #[arg(long)]
        candidate: Option<String>,
    },
    /// A forced change of leader to CANDIDATE, even with the leader alive: appends the
    /// candidate lacks are lost (the answer says how many bytes).
    Failover {
        #[command(flatten)]
        target: Target,
        /// The member to promote.
        #[arg(long)]
        candidate: String,
    },
    /// Automatic action off cluster-wide: no promotion, no demotion; the leader keeps its key.
    Pause {
        #[command(flatten)]
        target: Target,
    },
    /// Automatic action on again.
    Resume {
        #[command(flatten)]
        target: Target,
    },
    /// The permanent replication slots: kept on whichever member leads, their positions
    /// copied to the standbys, so a client's slot keeps its WAL through failovers.
    Slots {
        #[command(subcommand)]
        command: SlotsCommand,
    },
    /// The cluster's terms: who led, from where on which timeline, and why.
    History {
        #[command(flatten)]
        target: Target,
        /// Print `/history`'s JSON as the API gives it.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Subcommand, Clone, Debug)]
pub enum SlotsCommand {
    /// The permanent slots and the position the leader last wrote for each.
    List {
        #[command(flatten)]
        target: Target,
    },
    /// Makes NAME a permanent slot (a slot of that name already on the leader is kept as it
    /// is).
    Add {
        #[command(flatten)]
        target: Target,
        /// The slot's name, as a replication slot is named (lower-case letters, digits and
        /// underscores).
        name: String,
    },
    /// NAME is no longer permanent: every member drops its slot of that name (one a client
    /// streams through is left).
    Remove {
        #[command(flatten)]
        target: Target,
        /// The slot's name.
        name: String,
    },
}

pub fn run(cmd: ClusterCommand) -> anyhow::Result<()> {
    match cmd {
        ClusterCommand::List { target, json } => {
            let v = get_json(&target.http, "/cluster", target.token.as_deref())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", render_cluster(&v)?);
            }
        }
        ClusterCommand::History { target, json } => {
            let v = get_json(&target.http, "/history", target.token.as_deref())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", render_history(&v)?);
            }
        }
        ClusterCommand::Switchover { target, candidate } => {
            let body = serde_json::to_vec(&serde_json::json!({ "candidate": candidate }))?;
            let v = post(&target, "/switchover", &body)?;
            println!("{}", render_report("switchover", &v));
        }
        ClusterCommand::Failover { target, candidate } => {
            let body = serde_json::to_vec(&serde_json::json!({ "candidate": candidate }))?;
            let v = post(&target, "/failover", &body)?;
            println!("{}", render_report("failover", &v));
        }
        ClusterCommand::Pause { target } => {
            post(&target, "/pause", b"")?;
            println!("paused: no automatic promotion or demotion until `walserver cluster resume`");
        }
        ClusterCommand::Slots { command } => slots(command)?,
        ClusterCommand::Resume { target } => {
            post(&target, "/resume", b"")?;
            println!("resumed: automatic failover is on");
        }
    }
    Ok(())
}

fn slots(cmd: SlotsCommand) -> anyhow::Result<()> {
    match cmd {
        SlotsCommand::List { target } => {
            let v = get_json(&target.http, "/cluster", target.token.as_deref())?;
            print!("{}", render_slots(&v));
        }
        SlotsCommand::Add { target, name } => {
            let body = serde_json::to_vec(&serde_json::json!({ "name": name }))?;
            let v = post(&target, "/cluster/slots/add", &body)?;
            if v["added"] == Value::Bool(true) {
                println!("{name} is a permanent slot: the leader keeps it, the standbys copy its position");
            } else {
                println!("{name} was already a permanent slot");
            }
        }
        SlotsCommand::Remove { target, name } => {
            let body = serde_json::to_vec(&serde_json::json!({ "name": name }))?;
            let v = post(&target, "/cluster/slots/remove", &body)?;
            if v["removed"] == Value::Bool(true) {
                println!("{name} is no longer a permanent slot: the members drop it");
            } else {
                bail!("{name} is not a permanent slot");
            }
        }
    }
    Ok(())
}

/// `slots list`: one line per permanent slot with the position the leader last wrote.
fn render_slots(v: &Value) -> String {
    let Some(slots) = v["permanent_slots"].as_object().filter(|s| !s.is_empty()) else {
        return "no permanent slots\n".to_string();
    };
    slots
        .iter()
        .map(|(name, at)| match at.as_str() {
            Some(at) => format!("{name} {at}\n"),
            None => format!("{name} (not made yet)\n"),
        })
        .collect()
}

fn post(target: &Target, path: &str, body: &[u8]) -> anyhow::Result<Value> {
    Ok(post_json(
        &target.http,
        path,
        target.token.as_deref(),
        "application/json",
        body,
    )?)
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Milliseconds as seconds with one decimal (`8.2s`).
fn seconds(ms: &Value) -> String {
    ms.as_u64()
        .map(|ms| format!("{:.1}s", ms as f64 / 1000.0))
        .unwrap_or_default()
}

/// `/cluster` as people read it: the cluster's line, then one row per member.
pub fn render_cluster(v: &Value) -> anyhow::Result<String> {
    let Some(members) = v["members"].as_array() else {
        bail!("unexpected /cluster document: {v}");
    };
    let leader = &v["leader"];
    let leader_name = leader["name"].as_str();
    let mut out = format!(
        "cluster {} (synchronous_mode {}, ttl {}s)",
        text(&v["cluster"]),
        text(&v["synchronous_mode"]),
        text(&v["ttl_seconds"])
    );
    if v["paused"] == Value::Bool(true) {
        out.push_str(", PAUSED: no automatic failover");
    }
    out.push('\n');
    // What is wrong with the leader, if anything: a lease no longer renewed (its holder is
    // cut off, stopped or dead: the key goes when the lease runs out), an admin API that
    // does not answer.
    let mut leader_trouble = String::new();
    if leader["renewing"] == Value::Bool(false) {
        leader_trouble.push_str(", lease running out: not renewed");
    }
    if leader["api_reachable"] == Value::Bool(false) {
        leader_trouble.push_str(", admin API unreachable");
    }
    match leader_name {
        Some(name) => out.push_str(&format!(
            "leader {name}, term {}, lease {}{leader_trouble}\n",
            text(&leader["term"]),
            match seconds(&leader["lease_remaining_ms"]) {
                s if s.is_empty() => "remaining unknown".to_string(),
                s => format!("{s} remaining"),
            }
        )),
        None => out.push_str("no leader\n"),
    }
    if let Some(s) = v["sync_standby"].as_str() {
        out.push_str(&format!("synchronous standby {s}\n"));
    }
    let cols = [
        "", "name", "role", "state", "timeline", "lag", "term", "lease",
    ];
    let mut rows: Vec<Vec<String>> = members
        .iter()
        .map(|m| {
            let name = text(&m["name"]);
            let is_leader = leader_name == Some(name.as_str());
            let state = if is_leader {
                if leader_trouble.is_empty() {
                    "leading"
                } else {
                    leader_trouble.trim_start_matches(", ")
                }
            } else if m["role"] == "primary" {
                "primary without the key"
            } else if m["streaming"] == Value::Bool(true) {
                "streaming"
            } else {
                "not streaming"
            };
            let mut state = state.to_string();
            if m["nofailover"] == Value::Bool(true) || m["priority"] == 0 {
                state.push_str(", nofailover");
            }
            vec![
                if is_leader { "*" } else { "" }.to_string(),
                name,
                text(&m["role"]),
                state,
                text(&m["timeline"]),
                m["lag_bytes"].as_u64().map(format_size).unwrap_or_default(),
                text(&m["term"]),
                if is_leader {
                    seconds(&leader["lease_remaining_ms"])
                } else {
                    String::new()
                },
            ]
        })
        .collect();
    // Members whose key went, kept for a while: expected, but missing.
    for d in v["departed"].as_array().into_iter().flatten() {
        rows.push(vec![
            String::new(),
            text(&d["name"]),
            text(&d["role"]),
            format!("gone for {}", seconds(&d["gone_for_ms"])),
            text(&d["timeline"]),
            String::new(),
            String::new(),
            String::new(),
        ]);
    }
    rows.sort_by(|a, b| a[1].cmp(&b[1]));
    out.push_str(&crate::cli::table(&cols, &rows));
    Ok(out)
}

/// `/history` as a table, oldest term first.
pub fn render_history(v: &Value) -> anyhow::Result<String> {
    let Some(terms) = v.as_array() else {
        bail!("unexpected /history document: {v}");
    };
    let cols = ["term", "leader", "timeline", "switch_lsn", "reason", "at"];
    let rows: Vec<Vec<String>> = terms
        .iter()
        .map(|t| {
            let at = t["at"]
                .as_u64()
                .map(|s| {
                    wal_types::time::format_time(
                        std::time::UNIX_EPOCH + std::time::Duration::from_secs(s),
                    )
                })
                .unwrap_or_default();
            vec![
                text(&t["term"]),
                text(&t["leader"]),
                text(&t["timeline"]),
                text(&t["switch_lsn"]),
                text(&t["reason"]),
                at,
            ]
        })
        .collect();
    Ok(crate::cli::table(&cols, &rows))
}

/// What a switchover or failover did, in one line.
fn render_report(what: &str, v: &Value) -> String {
    let mut line = format!(
        "{what}: {} leads term {}",
        text(&v["new_leader"]),
        text(&v["term"])
    );
    if let Some(old) = v["old_leader"].as_str() {
        line.push_str(&format!(" after {old}"));
    }
    if let Some(ms) = v["appends_paused_ms"].as_u64() {
        line.push_str(&format!("; appends paused for {ms} ms"));
    }
    if let Some(lag) = v["candidate_lag_bytes"].as_u64() {
        line.push_str(&format!(
            "; the candidate was {lag} bytes behind (acknowledged appends it lacked are lost)"
        ));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> Value {
        serde_json::json!({
            "cluster": "main", "paused": false, "sync_standby": null,
            "synchronous_mode": "off", "ttl_seconds": 10, "history": [],
            "leader": {"name": "n2", "term": 7, "lease_remaining_ms": 8250},
            "members": [
                {"name": "n3", "role": "standby", "timeline": 2, "flush_lsn": "0/3000000",
                 "lag_bytes": 2097152, "streaming": false, "conninfo": "", "api_url": "",
                 "nofailover": true, "priority": 1, "term": 7},
                {"name": "n2", "role": "primary", "timeline": 2, "flush_lsn": "0/3200000",
                 "lag_bytes": null, "streaming": false, "conninfo": "", "api_url": "",
                 "nofailover": false, "priority": 1, "term": 7},
                {"name": "n1", "role": "standby", "timeline": 2, "flush_lsn": "0/3200000",
                 "lag_bytes": 0, "streaming": true, "conninfo": "", "api_url": "",
                 "nofailover": false, "priority": 1, "term": 7}
            ]
        })
    }

    /// The row of `t` whose name column is `name`, by column.
    fn row<'a>(t: &'a str, name: &str) -> Vec<&'a str> {
        t.lines()
            .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>())
            .find(|r| r.get(1) == Some(&name))
            .unwrap_or_else(|| panic!("no row {name} in\n{t}"))
    }

    #[test]
    fn the_list_marks_the_leader_and_shows_lag_and_lease() {
        let t = render_cluster(&cluster()).unwrap();
        assert!(
            t.starts_with("cluster main (synchronous_mode off, ttl 10s)\n"),
            "{t}"
        );
        assert!(t.contains("leader n2, term 7, lease 8.2s remaining"), "{t}");
        assert_eq!(
            row(&t, "n2"),
            ["*", "n2", "primary", "leading", "2", "", "7", "8.2s"]
        );
        assert_eq!(
            row(&t, "n1"),
            ["", "n1", "standby", "streaming", "2", "0", "7", ""]
        );
        assert_eq!(
            row(&t, "n3"),
            [
                "",
                "n3",
                "standby",
                "not streaming, nofailover",
                "2",
                "2MB",
                "7",
                ""
            ]
        );
        // Sorted by name.
        let order: Vec<usize> = ["n1", "n2", "n3"]
            .iter()
            .map(|n| t.find(&format!("| {n} ")).expect(n))
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{t}");

        let mut v = cluster();
        v["leader"] = Value::Null;
        v["paused"] = Value::Bool(true);
        let t = render_cluster(&v).unwrap();
        assert!(t.contains("PAUSED") && t.contains("no leader\n"), "{t}");
        assert_eq!(row(&t, "n2")[3], "primary without the key");
        assert!(render_cluster(&Value::Null).is_err());
    }

    /// A leader whose lease is not renewed and whose admin API does not answer is shown as
    /// such, on its line and in its row; a member whose key went is listed as gone.
    #[test]
    fn the_list_shows_a_failing_leader_and_departed_members() {
        let mut v = cluster();
        v["leader"]["renewing"] = Value::Bool(false);
        v["leader"]["api_reachable"] = Value::Bool(false);
        v["departed"] = serde_json::json!([
            {"name": "n0", "role": "standby", "timeline": 1, "flush_lsn": "0/2000000",
             "api_url": "", "gone_at": 1_800_000_000u64, "gone_for_ms": 12_340}
        ]);
        let t = render_cluster(&v).unwrap();
        assert!(
            t.contains("leader n2, term 7, lease 8.2s remaining, lease running out: not renewed, admin API unreachable\n"),
            "{t}"
        );
        assert_eq!(
            row(&t, "n2")[3],
            "lease running out: not renewed, admin API unreachable"
        );
        assert_eq!(
            row(&t, "n0"),
            ["", "n0", "standby", "gone for 12.3s", "1", "", "", ""]
        );
        v["leader"]["renewing"] = Value::Bool(true);
        let t = render_cluster(&v).unwrap();
        assert_eq!(row(&t, "n2")[3], "admin API unreachable");
    }

    #[test]
    fn history_rows_say_when_in_utc() {
        let v = serde_json::json!([
            {"term": 3, "leader": "n1", "timeline": 1, "switch_lsn": "0/0", "reason": "bootstrap", "at": 0},
            {"term": 9, "leader": "n2", "timeline": 2, "switch_lsn": "0/3000000", "reason": "failover", "at": 1_800_000_000u64}
        ]);
        let t = render_history(&v).unwrap();
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[2].starts_with("3    | n1"), "{t}");
        assert!(
            lines[3].contains("failover") && lines[3].contains("2027-01-15 08:00:00"),
            "{t}"
        );
        assert!(render_history(&Value::Null).is_err());
    }
}
