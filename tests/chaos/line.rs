//! Nodes streaming in a line, the shape of the crash scenarios: a primary, its synchronous
//! standby, and below it, if any, cascades, each node streaming to the next. After a fault the
//! scenarios wait for the line to converge before the next, and judge it when it has settled.

use std::time::Duration;

use wal_storage::Lsn;

use crate::node::*;

/// Waits until the line has converged and returns the primary's durable end it reached: each
/// node streams to the next (`nodes[i]` to the application name `names[i]`), every standby's
/// walreceiver streams, and then the last node is durable up to the primary's flush position
/// as it was once all did.
pub fn converge(nodes: &[ChildNode], names: &[&str]) -> anyhow::Result<Lsn> {
    let last = nodes.last().expect("a line has nodes");
    let target = wait_for(
        &format!("{} streaming to {}", nodes[0].name, names.join(" then ")),
        DEADLINE,
        Duration::from_millis(5),
        || {
            let statuses = nodes
                .iter()
                .map(|n| n.status().ok())
                .collect::<Option<Vec<_>>>()?;
            let streaming = statuses.iter().enumerate().all(|(i, s)| {
                (i == 0 || s.receiving()) && names.get(i).is_none_or(|name| s.streams_to(name))
            });
            streaming.then_some(statuses[0].flush_lsn)
        },
    )?;
    wait_for(
        &format!("{} durable up to the primary's {target}", last.name),
        DEADLINE,
        Duration::from_millis(5),
        || (last.status().ok()?.flush_lsn >= target).then_some(target),
    )
}

/// Converges with no writer left: until the primary's durable end no longer moves past the
/// converged position (an append already sent when the writers were killed may still land),
/// a few rounds at most.
pub fn settle(nodes: &[ChildNode], names: &[&str]) -> anyhow::Result<Lsn> {
    for _ in 0..10 {
        let end = converge(nodes, names)?;
        if nodes[0].status()?.flush_lsn == end {
            return Ok(end);
        }
    }
    anyhow::bail!("the primary's durable end kept moving with no writer")
}

/// The tail of every node's log, for a failing scenario to print.
pub fn logs(nodes: &[ChildNode]) -> String {
    nodes
        .iter()
        .map(|n| format!("--- {} ---\n{}\n", n.name, n.log_tail()))
        .collect()
}
