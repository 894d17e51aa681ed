//! The harness's own parts, against the real kernel: namespaces and their cleanup, link
//! faults, the delaying proxy, processes and tmpfs. Root is needed, as for every fault test.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use fault_harness::proxy::{Delay, DelayProxy};
use fault_harness::tmpfs::Tmpfs;
use fault_harness::{fault, Net, Process};

/// How long a connection that must fail is given: a cut drops its packets, so this is only
/// the wait before saying it failed.
const SHORT: Duration = Duration::from_millis(500);
/// How long a connection that must succeed is given: a new link's first SYN can be lost while
/// the link comes up, and TCP sends it again only after a second, so a positive check given
/// `SHORT` failed under load; the deadline is what a working link never needs.
const LONG: Duration = Duration::from_secs(5);

/// A listener on `host` at `port` that echoes what each connection sends, forever.
fn echo_server(host: &fault_harness::Host, port: u16) -> SocketAddr {
    let addr = SocketAddr::from((host.addr, port));
    let listener = host.run(|| TcpListener::bind(addr)).unwrap().unwrap();
    std::thread::spawn(move || {
        for c in listener.incoming() {
            let Ok(mut c) = c else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = c.read(&mut buf) {
                    if n == 0 || c.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Whether a TCP connection from `host` to `addr` is set up within `within`.
fn reaches(host: &fault_harness::Host, addr: SocketAddr, within: Duration) -> bool {
    host.run(|| TcpStream::connect_timeout(&addr, within).is_ok())
        .unwrap()
}

/// Whether a connection to `addr` made on the current thread echoes a byte within `within`.
fn echoes_here(addr: SocketAddr, within: Duration) -> bool {
    let Ok(mut c) = TcpStream::connect_timeout(&addr, within) else {
        return false;
    };
    c.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 1];
    c.write_all(b"e").is_ok() && matches!(c.read(&mut b), Ok(1)) && b[0] == b'e'
}

fn echoes(host: &fault_harness::Host, addr: SocketAddr) -> bool {
    host.run(|| echoes_here(addr, LONG)).unwrap()
}

fn netns_list() -> String {
    String::from_utf8(
        std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
}

#[test]
fn hosts_reach_each_other_and_everything_goes_with_the_net() {
    let mut net = Net::new("basic").unwrap();
    let a = net.add_host("a").unwrap();
    let b = net.add_host("b").unwrap();
    let echo = echo_server(&b, 7000);
    assert!(reaches(&a, echo, LONG));
    // The test's own namespace does not reach the hosts (a connect may still succeed, to
    // whatever the machine's default route leads to, but nothing echoes).
    assert!(echoes(&a, echo));
    assert!(!echoes_here(echo, SHORT));
    let names = [a.netns().to_string(), b.netns().to_string()];
    assert!(netns_list().contains(&names[0]));
    drop(net);
    let list = netns_list();
    assert!(
        !list.contains(&names[0]) && !list.contains(&names[1]),
        "{list}"
    );
}

#[test]
fn a_cut_stops_traffic_both_ways_until_healed() {
    let mut net = Net::new("cut").unwrap();
    let a = net.add_host("a").unwrap();
    let b = net.add_host("b").unwrap();
    let to_b = echo_server(&b, 7000);
    let to_a = echo_server(&a, 7000);
    let cut = fault::cut(&a, &b).unwrap();
    assert!(!reaches(&a, to_b, SHORT));
    assert!(!reaches(&b, to_a, SHORT));
    cut.heal().unwrap();
    assert!(reaches(&a, to_b, LONG));
    assert!(reaches(&b, to_a, LONG));
}

#[test]
fn a_one_way_drop_stops_one_direction() {
    let mut net = Net::new("oneway").unwrap();
    let a = net.add_host("a").unwrap();
    let b = net.add_host("b").unwrap();
    let b_udp = b.run(|| UdpSocket::bind((b.addr, 7001))).unwrap().unwrap();
    let a_udp = a.run(|| UdpSocket::bind((a.addr, 7001))).unwrap().unwrap();
    b_udp.set_read_timeout(Some(SHORT)).unwrap();
    a_udp.set_read_timeout(Some(LONG)).unwrap();
    let one_way = fault::drop_one_way(&a, &b).unwrap();
    let mut buf = [0u8; 16];
    a_udp.send_to(b"x", (b.addr, 7001)).unwrap();
    assert!(b_udp.recv_from(&mut buf).is_err(), "a -> b must be dropped");
    b_udp.send_to(b"y", (a.addr, 7001)).unwrap();
    assert_eq!(a_udp.recv_from(&mut buf).unwrap().0, 1, "b -> a must pass");
    drop(one_way);
    b_udp.set_read_timeout(Some(LONG)).unwrap();
    a_udp.send_to(b"x", (b.addr, 7001)).unwrap();
    assert_eq!(b_udp.recv_from(&mut buf).unwrap().0, 1, "healed on drop");
}

#[test]
fn loss_drops_about_the_share_asked_for() {
    let mut net = Net::new("loss").unwrap();
    let a = net.add_host("a").unwrap();
    let b = net.add_host("b").unwrap();
    let b_udp = b.run(|| UdpSocket::bind((b.addr, 7001))).unwrap().unwrap();
    let a_udp = a.run(|| UdpSocket::bind((a.addr, 0))).unwrap().unwrap();
    b_udp.set_read_timeout(Some(SHORT)).unwrap();
    let _loss = fault::loss(&a, &b, 50).unwrap();
    // The receiver reads while the sender sends, so that its socket buffer never overflows
    // (which would look like loss).
    let receiver = std::thread::spawn(move || {
        let mut got = 0;
        let mut buf = [0u8; 16];
        while b_udp.recv_from(&mut buf).is_ok() {
            got += 1;
        }
        got
    });
    let sent = 1000;
    for i in 0..sent {
        a_udp
            .send_to(&(i as u32).to_be_bytes(), (b.addr, 7001))
            .unwrap();
        if i % 50 == 0 {
            // Paced a little: the loss under test is the rule's, not the receiver's.
            std::thread::yield_now();
        }
    }
    let got = receiver.join().unwrap();
    // Binomial(1000, 0.5): 500 with a standard deviation of 16; 400..=600 is six of them.
    assert!(
        (400..=600).contains(&got),
        "{got} of {sent} arrived at 50% loss"
    );
}

#[test]
fn the_proxy_delays_both_ways_and_keeps_the_order() {
    let mut net = Net::new("proxy").unwrap();
    let a = net.add_host("a").unwrap();
    let b = net.add_host("b").unwrap();
    let echo = echo_server(&a, 7000);
    let delay = Delay {
        delay: Duration::from_millis(100),
        jitter: Duration::from_millis(50),
    };
    let proxy = DelayProxy::start(&b, echo, delay).unwrap();
    let mut c = b
        .run(|| TcpStream::connect_timeout(&proxy.addr(), LONG))
        .unwrap()
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let start = Instant::now();
    let mut want = Vec::new();
    for i in 0..50u8 {
        c.write_all(&[i]).unwrap();
        want.push(i);
    }
    let mut got = vec![0u8; want.len()];
    c.read_exact(&mut got).unwrap();
    let rtt = start.elapsed();
    assert_eq!(got, want, "bytes reordered");
    // Each way at least delay - jitter.
    assert!(rtt >= Duration::from_millis(100), "round trip {rtt:?}");
    assert!(proxy.forwarded() >= 100);
    drop(proxy);
    // Stopping the proxy closes its connections.
    let mut buf = [0u8; 1];
    assert!(matches!(c.read(&mut buf), Ok(0) | Err(_)));
}

#[test]
fn processes_signal_ready_pause_and_die_with_their_guard() {
    let mut net = Net::new("proc").unwrap();
    let a = net.add_host("a").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut cmd = a.command("sh");
    cmd.args(["-c", "ip -o addr show dev eth0; echo ready; exec sleep 600"]);
    let mut p =
        Process::spawn_ready("sleeper", cmd, &log, "ready", Duration::from_secs(10)).unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&a.addr.to_string()),
        "ran outside the host: {text}"
    );
    let state = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        stat.rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    p.pause().unwrap();
    assert_eq!(state(p.pid()), "T");
    p.resume().unwrap();
    assert_ne!(state(p.pid()), "T");
    let pid = p.pid();
    drop(p);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());

    let mut cmd = a.command("sh");
    cmd.args(["-c", "echo bye; exit 3"]);
    let err = Process::spawn_ready("quitter", cmd, &log, "never", Duration::from_secs(10))
        .err()
        .unwrap();
    assert!(err.to_string().contains("exited"), "{err}");
}

#[test]
fn a_tmpfs_fills_up_and_is_unmounted_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("small");
    let fs = Tmpfs::mount(&mnt, 1 << 20).unwrap();
    let err = std::fs::write(mnt.join("big"), vec![0u8; 2 << 20]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    let mounted = || {
        std::fs::read_to_string("/proc/mounts")
            .unwrap()
            .contains(&mnt.display().to_string())
    };
    assert!(mounted());
    drop(fs);
    assert!(!mounted());
}

#[test]
fn a_line_watch_wakes_when_the_file_grows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    let mut w = fault_harness::watch::LineWatch::new(&path).unwrap();
    assert_eq!(w.lines().unwrap(), 0);
    let p = path.clone();
    let writer = std::thread::spawn(move || {
        let mut f = std::fs::File::create(&p).unwrap();
        for i in 0..5 {
            writeln!(f, "line {i}").unwrap();
        }
        write!(f, "partial").unwrap();
    });
    assert_eq!(w.wait_lines(5, Duration::from_secs(10)).unwrap(), 5);
    writer.join().unwrap();
    assert_eq!(
        w.lines().unwrap(),
        5,
        "a line without its newline is not counted"
    );
    assert!(w.wait_lines(6, Duration::from_millis(100)).is_err());
}

/// A wait for lines from a writer that exits short of them ends at its exit, with the lines
/// it wrote counted, not at the deadline; one that has them is answered as before.
#[test]
fn a_line_wait_ends_when_its_writer_exits() {
    use fault_harness::watch::{ExitWatch, LineWatch};
    const LONG: Duration = Duration::from_secs(60);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    let mut w = LineWatch::new(&path).unwrap();
    let mut writer = std::process::Command::new("sh")
        .args(["-c", "echo one >> \"$0\"; echo two >> \"$0\"; exit 3"])
        .arg(&path)
        .spawn()
        .unwrap();
    let exit = ExitWatch::of(writer.id()).unwrap();
    let started = Instant::now();
    let e = w.wait_lines_or_exit(3, LONG, Some(&exit)).unwrap_err();
    assert!(
        started.elapsed() < LONG / 2,
        "the wait ran {:?} after its writer exited",
        started.elapsed()
    );
    assert!(
        matches!(e, fault_harness::Error::Exited(_)) && e.to_string().contains("has 2 lines"),
        "{e}"
    );
    assert!(exit.exited());
    assert_eq!(w.wait_lines_or_exit(2, LONG, Some(&exit)).unwrap(), 2);
    assert_eq!(writer.wait().unwrap().code(), Some(3));
}

#[test]
fn a_dir_watch_asks_again_at_each_change_and_gives_up_at_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (partial, done) = (dir.path().join("seg.partial"), dir.path().join("seg"));
    std::fs::write(&partial, b"wal").unwrap();
    let w = fault_harness::watch::DirWatch::new(dir.path()).unwrap();
    // The first look finds nothing and renames the file into place, as a writer completing
    // it would: only the rename's event can make the watch look again.
    let mut looks = 0;
    let started = Instant::now();
    w.wait_until("the renamed file", Duration::from_secs(30), || {
        looks += 1;
        if looks == 1 {
            std::fs::rename(&partial, &done).unwrap();
            return false;
        }
        done.exists()
    })
    .expect("woken by the rename");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "it waited out its deadline"
    );
    let e = w
        .wait_until("a file never made", Duration::from_millis(100), || {
            dir.path().join("never").exists()
        })
        .unwrap_err();
    assert!(e.to_string().contains("a file never made"), "{e}");
}

#[test]
fn a_bandwidth_cap_slows_a_stream_until_removed() {
    let mut net = Net::new("tbf").unwrap();
    let a = net.add_host("a").unwrap();
    let b = net.add_host("b").unwrap();
    // A sink on b: reads to the end, then answers one byte.
    let addr = SocketAddr::from((b.addr, 7002));
    let listener = b.run(|| TcpListener::bind(addr)).unwrap().unwrap();
    std::thread::spawn(move || {
        for c in listener.incoming() {
            let Ok(mut c) = c else { return };
            let mut sink = Vec::new();
            if c.read_to_end(&mut sink).is_ok() {
                let _ = c.write_all(b"k");
            }
        }
    });
    let send = |n: usize| {
        a.run(|| {
            let mut c = TcpStream::connect_timeout(&addr, LONG).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let t = Instant::now();
            c.write_all(&vec![7u8; n]).unwrap();
            c.shutdown(std::net::Shutdown::Write).unwrap();
            let mut k = [0u8; 1];
            c.read_exact(&mut k).unwrap();
            t.elapsed()
        })
        .unwrap()
    };
    let cap = fault::bandwidth(&a, 1000).unwrap();
    // 256 KiB at 1000 kbit/s is 2.1 s, less the 32 kB burst.
    let capped = send(256 << 10);
    cap.heal().unwrap();
    let free = send(256 << 10);
    assert!(capped >= Duration::from_millis(1500), "capped: {capped:?}");
    assert!(free < capped / 4, "uncapped {free:?} vs capped {capped:?}");
}
