//! What `/proc` says about a process the benchmark started.

#![allow(dead_code)]

/// Its resident set size (`VmRSS`), in KiB; 0 when it is gone.
pub fn rss_kib(pid: u32) -> u64 {
    rss(pid).total
}

/// Resident memory of a process, KiB: in all, anonymous, and file-backed (mostly machine code).
#[derive(Clone, Copy, Debug, Default)]
pub struct Rss {
    pub total: u64,
    pub anon: u64,
    pub file: u64,
}

impl std::fmt::Display for Rss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |kib: u64| kib as f64 / 1024.0;
        write!(f, "{:.1} MiB ({:.1} anonymous, {:.1} file-backed)", mib(self.total), mib(self.anon), mib(self.file))
    }
}

/// Its resident memory from `/proc/PID/status`; zeros when it is gone.
pub fn rss(pid: u32) -> Rss {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Rss { total: field("VmRSS:"), anon: field("RssAnon:"), file: field("RssFile:") }
}

/// The CPU time it has used (user and system, `/proc/PID/stat`), in seconds; 0 when it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces) start at state, field 3.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let ticks: u64 = [11, 12].iter().filter_map(|i| fields.get(*i)?.parse::<u64>().ok()).sum();
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks as f64 / per_second
}
