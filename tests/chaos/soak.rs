//! The soak bench at a tiny scale: three seconds with the standby restarted every second. The
//! samples must cover both nodes over the whole run, the restarts must have happened (the
//! standby's samples come from more than one process), and the CSV and SVG must be written.

use walserver_bench::soak::{self, SoakArgs, PRIMARY, STANDBY};
use walserver_bench::NodeProgram;

#[test]
fn a_tiny_soak_samples_every_node_and_restarts_the_standby() {
    let dir = tempfile::tempdir().expect("tempdir");
    let args = SoakArgs {
        seconds: 3.0,
        restart_every: 1.0,
        sample_every: 0.25,
        writers: 1,
        size: 64,
        batch: 4,
        sync: false,
        dir: Some(dir.path().to_path_buf()),
        csv: dir.path().join("soak.csv"),
        plot: dir.path().join("soak.svg"),
        json: true,
    };
    let program = NodeProgram::Path(env!("CARGO_BIN_EXE_walserver").into());
    let r = soak::measure(&args, &program).expect("soak");
    assert!(r.seconds >= 3.0, "{}", r.seconds);
    assert!(
        r.restarts_s.len() >= 2,
        "restarts at {:?} in a 3 s soak restarting every second",
        r.restarts_s
    );
    assert!(r.appends > 0, "no append: {:?}", r.first_error);
    for node in [PRIMARY, STANDBY] {
        let mine: Vec<_> = r.samples.iter().filter(|s| s.node == node).collect();
        assert!(mine.len() >= 8, "{node}: {} samples", mine.len());
        assert!(mine.iter().all(|s| s.rss_bytes > 0 && s.fds > 0));
        let last = mine.last().map(|s| s.t_s).unwrap_or(0.0);
        assert!(last >= 2.5, "{node}: the last sample at {last} s");
    }
    let mut pids: Vec<u32> = r
        .samples
        .iter()
        .filter(|s| s.node == STANDBY)
        .map(|s| s.pid)
        .collect();
    pids.dedup();
    assert!(
        pids.len() >= 2,
        "the standby was never restarted: pids {pids:?}"
    );
    let summary = r
        .nodes
        .iter()
        .find(|n| n.node == PRIMARY)
        .expect("a primary summary");
    assert!(summary.rss_start > 0 && summary.fds_end > 0);

    soak::write_csv(&args.csv, &r.samples).expect("csv");
    soak::plot(&args.plot, &r).expect("svg");
    let csv = std::fs::read_to_string(&args.csv).expect("read csv");
    assert_eq!(csv.lines().count(), r.samples.len() + 1);
    assert!(csv.starts_with("t_s,node,pid,rss_bytes,fds\n"));
    let svg = std::fs::read_to_string(&args.plot).expect("read svg");
    assert!(svg.contains("resident memory") && svg.contains("descriptors"));
}
