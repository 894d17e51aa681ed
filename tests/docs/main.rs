//! The documents that make claims about the code, checked against it.
//!
//! ARCHITECTURE.md draws the workspace's crates with their dependencies as a table: each line
//! names a crate and the workspace crates it depends on, those in brackets for its tests only.
//! This test reads that table and `cargo metadata`, and fails on any edge one has and the
//! other lacks, on a crate listed twice or not at all, and on a dependency drawn below the
//! crate that needs it (the page's order is the layering: dependencies point up).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

/// The heading whose first code block is the crate table.
const TABLE_HEADING: &str = "## Crates and the way dependencies point";

/// A map is about 200 lines; past this it has become an atlas again, and what grew belongs in
/// the crates' own `lib.rs` stories. The margin over 200 is a guess at honest growth.
const MAX_LINES: usize = 240;

#[derive(Debug, Default, PartialEq, Eq)]
struct Edges {
    normal: BTreeSet<String>,
    tests: BTreeSet<String>,
}

/// The workspace's crates and their edges to each other, from `cargo metadata`. A crate's
/// dependency on itself (etcd-gateway turns on its own test kit for its tests) is no edge.
fn metadata_edges(root: &Path) -> anyhow::Result<BTreeMap<String, Edges>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let packages = meta["packages"]
        .as_array()
        .context("no packages in metadata")?;
    let names: BTreeSet<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect();
    let mut edges = BTreeMap::new();
    for p in packages {
        let name = p["name"]
            .as_str()
            .context("a package without a name")?
            .to_owned();
        let mut e = Edges::default();
        for dep in p["dependencies"]
            .as_array()
            .context("no dependencies array")?
        {
            let dep_name = dep["name"]
                .as_str()
                .context("a dependency without a name")?;
            if !names.contains(dep_name) || dep_name == name {
                continue;
            }
            match dep["kind"].as_str() {
                Some("dev") => e.tests.insert(dep_name.to_owned()),
                _ => e.normal.insert(dep_name.to_owned()),
            };
        }
        // A crate both depended on and used by the tests is an ordinary dependency.
        e.tests = e.tests.difference(&e.normal).cloned().collect();
        edges.insert(name, e);
    }
    Ok(edges)
}

/// The table's rows in page order: each crate with its drawn edges.
fn drawn_edges(doc: &str, crates: &BTreeSet<String>) -> anyhow::Result<Vec<(String, Edges)>> {
    let after = doc
        .split_once(TABLE_HEADING)
        .with_context(|| format!("ARCHITECTURE.md has no heading {TABLE_HEADING:?}"))?
        .1;
    let block = after
        .split("```")
        .nth(1)
        .context("no code block under the crate table's heading")?;
    let mut rows = Vec::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let mut subject = None;
        let mut e = Edges::default();
        let mut in_brackets = false;
        for raw in line.split_whitespace() {
            let opens = raw.starts_with('[');
            let closes = raw.ends_with(']');
            let word = raw.trim_start_matches('[').trim_end_matches(']');
            in_brackets |= opens;
            if crates.contains(word) {
                match subject {
                    None if !in_brackets => subject = Some(word.to_owned()),
                    None => bail!("a bracketed crate before the row's crate: {line:?}"),
                    Some(_) if in_brackets => {
                        e.tests.insert(word.to_owned());
                    }
                    Some(_) => {
                        e.normal.insert(word.to_owned());
                    }
                }
            } else if subject.is_some() && word != "-" {
                bail!("{word:?} in the crate table is no workspace crate: {line:?}");
            }
            in_brackets &= !closes;
        }
        let subject = subject.with_context(|| format!("a table row without a crate: {line:?}"))?;
        rows.push((subject, e));
    }
    Ok(rows)
}

#[test]
fn architecture_draws_every_crate_edge_of_cargo_metadata() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md"))?;
    let actual = metadata_edges(root)?;
    let crates: BTreeSet<String> = actual.keys().cloned().collect();
    let rows = drawn_edges(&doc, &crates)?;

    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for (crate_name, drawn) in &rows {
        if !seen.insert(crate_name.clone()) {
            problems.push(format!("{crate_name} is drawn twice"));
            continue;
        }
        let real = &actual[crate_name];
        for (kind, drawn_set, real_set) in [
            ("an edge", &drawn.normal, &real.normal),
            ("a test-only edge", &drawn.tests, &real.tests),
        ] {
            for missing in real_set.difference(drawn_set) {
                problems.push(format!("{crate_name} -> {missing}: {kind} not drawn"));
            }
            for extra in drawn_set.difference(real_set) {
                problems.push(format!(
                    "{crate_name} -> {extra}: drawn as {kind} but no such dependency"
                ));
            }
        }
        for dep in &drawn.normal {
            if !seen.contains(dep) {
                problems.push(format!(
                    "{crate_name} -> {dep}: the dependency is drawn below the crate"
                ));
            }
        }
    }
    for missing in crates.difference(&seen) {
        problems.push(format!("{missing} is not in the crate table"));
    }
    assert!(
        problems.is_empty(),
        "ARCHITECTURE.md's crate table is wrong:\n{}",
        problems.join("\n")
    );
    Ok(())
}

#[test]
fn architecture_stays_a_map() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lines = std::fs::read_to_string(root.join("ARCHITECTURE.md"))?
        .lines()
        .count();
    assert!(
        lines <= MAX_LINES,
        "ARCHITECTURE.md has {lines} lines, over {MAX_LINES}: move the story into the crate's lib.rs"
    );
    Ok(())
}

/// The table parser itself, on a small table: brackets, a dash for none, a stray name.
#[test]
fn the_table_parser_reads_brackets_and_refuses_strangers() -> anyhow::Result<()> {
    let crates: BTreeSet<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    let doc = format!("{TABLE_HEADING}\n\n```\nleaves a -\n  b a [c]\nmore c a b [a b]\n```\n");
    let rows = drawn_edges(&doc, &crates)?;
    let names: Vec<_> = rows.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert!(rows[0].1.normal.is_empty() && rows[0].1.tests.is_empty());
    assert_eq!(rows[1].1.normal, BTreeSet::from(["a".to_string()]));
    assert_eq!(rows[1].1.tests, BTreeSet::from(["c".to_string()]));
    assert_eq!(rows[2].1.tests.len(), 2);
    let stray = format!("{TABLE_HEADING}\n```\nx a zz\n```\n");
    assert!(drawn_edges(&stray, &crates).is_err());
    Ok(())
}

/// ARCHITECTURE.md's claim that the server program does not link the load tool's plotting,
/// histogram and progress-bar crates (`walserver bench` runs the `walserver-bench` program).
#[test]
fn the_server_links_none_of_the_load_tools_crates() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "-p",
            "walserver",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--offline",
        ])
        .current_dir(root)
        .output()
        .context("running cargo tree")?;
    if !out.status.success() {
        bail!(
            "cargo tree failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let tree = String::from_utf8(out.stdout)?;
    assert!(
        tree.contains("walserver-node"),
        "an unexpected tree:\n{tree}"
    );
    let linked: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| ["plotters", "hdrhistogram", "indicatif", "walserver-bench"].contains(name))
        .collect();
    assert!(linked.is_empty(), "walserver links {linked:?}");
    Ok(())
}
