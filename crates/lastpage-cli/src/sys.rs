//! Operating-system counters the benchmarks report: context switches and CPU time from
//! `getrusage(2)`, available memory from `/proc/meminfo`.

use std::mem::MaybeUninit;

/// Context switches and CPU time of a thread or of the whole process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Voluntary context switches (`ru_nvcsw`): the thread blocked (parked on a latch, a futex).
    pub voluntary: u64,
    /// Involuntary context switches (`ru_nivcsw`): the scheduler preempted the thread.
    pub involuntary: u64,
    /// User plus system CPU time, in microseconds.
    pub cpu_us: u64,
}

impl Usage {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Usage) -> Usage {
        Usage {
            voluntary: self.voluntary.saturating_sub(earlier.voluntary),
            involuntary: self.involuntary.saturating_sub(earlier.involuntary),
            cpu_us: self.cpu_us.saturating_sub(earlier.cpu_us),
        }
    }

    /// Adds `other` to `self`.
    pub fn add(&mut self, other: &Usage) {
        self.voluntary += other.voluntary;
        self.involuntary += other.involuntary;
        self.cpu_us += other.cpu_us;
    }

    /// Voluntary plus involuntary context switches.
    pub fn context_switches(&self) -> u64 {
        self.voluntary + self.involuntary
    }
}

fn getrusage(who: libc::c_int) -> Option<Usage> {
    let mut usage = MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: `usage.as_mut_ptr()` is valid for writes of one `libc::rusage` and outlives the
    // call; getrusage only writes through it.
    let rc = unsafe { libc::getrusage(who, usage.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: getrusage returned 0, so it filled in the whole struct.
    let usage = unsafe { usage.assume_init() };
    let micros = |time: libc::timeval| {
        u64::try_from(time.tv_sec).unwrap_or(0) * 1_000_000
            + u64::try_from(time.tv_usec).unwrap_or(0)
    };
    Some(Usage {
        voluntary: u64::try_from(usage.ru_nvcsw).unwrap_or(0),
        involuntary: u64::try_from(usage.ru_nivcsw).unwrap_or(0),
        cpu_us: micros(usage.ru_utime) + micros(usage.ru_stime),
    })
}

/// The whole process's counters (every thread, live or exited): `getrusage(RUSAGE_SELF)`.
pub fn process_usage() -> Usage {
    getrusage(libc::RUSAGE_SELF).unwrap_or_default()
}

/// The calling thread's counters: `getrusage(RUSAGE_THREAD)` (Linux); `None` elsewhere.
pub fn thread_usage() -> Option<Usage> {
    #[cfg(target_os = "linux")]
    {
        getrusage(libc::RUSAGE_THREAD)
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// CPU time the whole machine spent busy (every process, every CPU), from the first line of
/// `/proc/stat`: user, nice, system, irq, softirq and steal (time the hypervisor gave to other
/// guests, so this machine could not use it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MachineCpu {
    busy_sec: f64,
    at: std::time::Instant,
}

impl MachineCpu {
    /// Reads `/proc/stat` now; `None` if it is missing or unreadable.
    pub fn now() -> Option<MachineCpu> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let line = stat.lines().find(|line| line.starts_with("cpu "))?;
        let fields: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|field| field.parse().unwrap_or(0))
            .collect();
        let field = |index: usize| fields.get(index).copied().unwrap_or(0);
        // user nice system idle iowait irq softirq steal ...
        let busy_ticks = field(0) + field(1) + field(2) + field(5) + field(6) + field(7);
        Some(MachineCpu {
            busy_sec: busy_ticks as f64 / clock_ticks_per_second(),
            at: std::time::Instant::now(),
        })
    }

    /// The share of the machine's CPU capacity (0..=100) that was busy between `earlier` and
    /// `self` with work other than `ours` (our own CPU seconds over the same interval).
    pub fn other_load_percent(&self, earlier: &MachineCpu, ours_sec: f64) -> Option<f64> {
        let cpus = std::thread::available_parallelism().ok()?.get() as f64;
        let wall = self.at.saturating_duration_since(earlier.at).as_secs_f64();
        // /proc/stat counts in clock ticks (10 ms at 100 Hz): too coarse for short intervals.
        if wall < 0.2 {
            return None;
        }
        let other = (self.busy_sec - earlier.busy_sec - ours_sec).max(0.0);
        Some((other / (wall * cpus) * 100.0).clamp(0.0, 100.0))
    }
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions; it only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// `MemAvailable` from `/proc/meminfo`, in bytes, if the system reports it.
pub fn available_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo
        .lines()
        .find(|line| line.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_only_grow() {
        let before = process_usage();
        std::thread::sleep(std::time::Duration::from_millis(1));
        let after = process_usage();
        assert!(after.context_switches() >= before.context_switches());
        if let Some(thread) = thread_usage() {
            assert!(thread.context_switches() <= after.context_switches());
        }
    }
}
