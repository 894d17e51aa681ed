//! What the kernel says about processes and threads: CPU time and memory, read from `/proc`
//! (Linux only; elsewhere the figures are absent, never wrong).

use std::path::Path;
use std::time::Duration;

/// Clock ticks per second for `/proc/*/stat` times (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// User + system CPU time of a process or thread from its `stat` file (fields 14 and 15).
fn stat_cpu(path: &Path) -> Option<Duration> {
    let text = std::fs::read_to_string(path).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: split after it.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state), so utime (14) and stime (15) are at 11 and 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_secs_f64(
        (utime + stime) as f64 / clock_ticks(),
    ))
}

/// CPU time a process has used so far (all its threads, live and ended).
pub fn process_cpu(pid: u32) -> Option<Duration> {
    stat_cpu(Path::new(&format!("/proc/{pid}/stat")))
}

/// The thread ids of this process.
pub fn own_threads() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// CPU time of the given threads of this process (threads that have ended count as zero).
pub fn threads_cpu(tids: &[u32]) -> Duration {
    tids.iter()
        .filter_map(|t| stat_cpu(Path::new(&format!("/proc/self/task/{t}/stat"))))
        .sum()
}

/// This thread's id, as `/proc/self/task` names it.
pub fn current_tid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// A `kB` line of `/proc/PID/status` (`VmHWM`, `VmRSS`), in bytes.
fn status_kb(pid: Option<u32>, key: &str) -> Option<u64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".to_string(),
    };
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// Peak resident set size (`VmHWM`) of a process, or of this one with `None`.
pub fn peak_rss(pid: Option<u32>) -> Option<u64> {
    status_kb(pid, "VmHWM")
}

/// Current resident set size (`VmRSS`).
pub fn rss(pid: Option<u32>) -> Option<u64> {
    status_kb(pid, "VmRSS")
}

/// CPU time this whole process has used (`getrusage(RUSAGE_SELF)`).
pub fn self_cpu() -> Duration {
    // SAFETY: getrusage writes into the struct we pass and has no other effects.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let pid = std::process::id();
        assert!(process_cpu(pid).is_some());
        assert!(peak_rss(None).unwrap() >= rss(None).unwrap() / 2);
        assert!(peak_rss(Some(pid)).unwrap() > 0);
        let me = current_tid();
        assert!(own_threads().contains(&me));
        // Burn a little CPU so the thread's own counter has something to show.
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        assert!(self_cpu() >= threads_cpu(&[me]));
        assert!(process_cpu(u32::MAX).is_none());
    }
}
