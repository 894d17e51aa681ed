//! `lossyfs [--sync-latency-ms MS] BACKING MOUNTPOINT`: mounts BACKING at MOUNTPOINT, prints
//! one line once it is mounted, and unmounts when sent SIGTERM or SIGINT. For shell scripts
//! that want a disk of its own per process (`benches/compare-postgres.sh`); tests use the
//! library's handle, which can also crash the mount.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

fn usage() -> ! {
    eprintln!("usage: lossyfs [--sync-latency-ms MS] BACKING MOUNTPOINT");
    std::process::exit(2);
}

fn main() {
    let mut latency = Duration::ZERO;
    let mut paths = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--sync-latency-ms" {
            let ms: f64 = args
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage());
            latency = Duration::from_secs_f64(ms / 1000.0);
        } else if a.starts_with('-') {
            usage();
        } else {
            paths.push(PathBuf::from(a));
        }
    }
    let [backing, mountpoint] = <[PathBuf; 2]>::try_from(paths).unwrap_or_else(|_| usage());

    // The signals are blocked before the file system's threads start, so that they inherit
    // the mask and only the wait below takes them.
    // SAFETY: plain signal-set calls on a set this function owns.
    let set = unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let options = lossyfs::Options {
        sync_latency: latency,
    };
    let fs = match lossyfs::LossyFs::mount(&backing, &mountpoint, options) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("lossyfs: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "lossyfs: mounted {} at {} (sync latency {latency:?})",
        backing.display(),
        mountpoint.display()
    );
    let _ = std::io::stdout().flush();
    let mut sig = 0;
    // SAFETY: waits for one of the blocked signals of `set`.
    unsafe { libc::sigwait(&set, &mut sig) };
    if let Err(e) = fs.unmount() {
        eprintln!("lossyfs: {e}");
        std::process::exit(1);
    }
}
