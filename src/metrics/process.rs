//! The standard `process_*` series, read from `/proc/self` as Prometheus' own clients read
//! them: CPU time and the start time from `stat` (in clock ticks since boot, with `btime`
//! from `/proc/stat`), memory from `stat`'s page counts, open descriptors by counting
//! `/proc/self/fd`, their limit from `getrlimit`. Every read is a file read: callers run it
//! on the blocking pool.

use std::io;

/// The process's figures at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub start_time_seconds: f64,
    pub open_fds: u64,
    pub max_fds: u64,
    pub threads: u64,
}

impl ProcessStats {
    /// Reads them from `/proc`; an error if a file is missing or not as Linux writes it.
    pub fn read() -> io::Result<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat")?;
        let boot = boot_time(&std::fs::read_to_string("/proc/stat")?)
            .ok_or_else(|| invalid("/proc/stat has no btime line"))?;
        // SAFETY: sysconf reads a constant of the system and touches no memory of ours.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if ticks <= 0 || page <= 0 {
            return Err(invalid("sysconf gave no clock tick or page size"));
        }
        let fields = StatFields::parse(&stat).ok_or_else(|| invalid("/proc/self/stat"))?;
        let open_fds = std::fs::read_dir("/proc/self/fd")?.count() as u64;
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit into the struct we own.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let ticks = ticks as f64;
        Ok(ProcessStats {
            cpu_seconds: (fields.utime + fields.stime) as f64 / ticks,
            resident_bytes: fields.rss_pages.saturating_mul(page as u64),
            virtual_bytes: fields.vsize,
            start_time_seconds: boot as f64 + fields.start_ticks as f64 / ticks,
            open_fds,
            max_fds: limit.rlim_cur,
            threads: fields.threads,
        })
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("unreadable {what}"))
}

/// The fields of `/proc/self/stat` the series need.
#[derive(Debug, PartialEq, Eq)]
struct StatFields {
    utime: u64,
    stime: u64,
    threads: u64,
    start_ticks: u64,
    vsize: u64,
    rss_pages: u64,
}

impl StatFields {
    /// `pid (comm) state ppid ...`: the command name may hold spaces and parentheses, so the
    /// fields are counted from after its last `)`, where field 3 (`state`) begins.
    fn parse(stat: &str) -> Option<StatFields> {
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // Field n of proc(5) (1-based) is fields[n - 3] here.
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some(StatFields {
            utime: field(14)?,
            stime: field(15)?,
            threads: field(20)?,
            start_ticks: field(22)?,
            vsize: field(23)?,
            rss_pages: field(24)?,
        })
    }
}

/// The boot time in seconds since the epoch: `/proc/stat`'s `btime` line.
fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with a space and a parenthesis, as a process may name itself.
        let stat = "4242 (wal) server) S 1 4242 4242 0 -1 4194560 2015 0 0 0 \
                    731 152 0 0 20 0 9 0 123456 567890123 4321 18446744073709551615";
        assert_eq!(
            StatFields::parse(stat),
            Some(StatFields {
                utime: 731,
                stime: 152,
                threads: 9,
                start_ticks: 123456,
                vsize: 567890123,
                rss_pages: 4321,
            })
        );
        assert_eq!(StatFields::parse("4242 (cut short) S 1 2"), None);
        assert_eq!(StatFields::parse("no parenthesis"), None);
    }

    #[test]
    fn boot_time_is_the_btime_line() {
        assert_eq!(
            boot_time("cpu 1 2 3\nbtime 1764979200\nprocesses 9\n"),
            Some(1764979200)
        );
        assert_eq!(boot_time("cpu 1 2 3\n"), None);
    }

    #[test]
    fn this_process_reads_as_running_with_descriptors_open() {
        let p = ProcessStats::read().expect("/proc/self is readable on Linux");
        assert!(p.open_fds >= 3 && p.open_fds <= p.max_fds, "{p:?}");
        assert!(
            p.resident_bytes > 0 && p.virtual_bytes >= p.resident_bytes,
            "{p:?}"
        );
        assert!(p.threads >= 1, "{p:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after the epoch")
            .as_secs_f64();
        assert!(p.start_time_seconds <= now + 1.0 && p.start_time_seconds > now - 86_400.0 * 365.0);
    }
}
