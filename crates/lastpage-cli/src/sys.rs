//! Operating-system counters the benchmarks report: context switches and CPU time from
//! `getrusage(2)`, available memory from `/proc/meminfo`, the processor model from
//! `/proc/cpuinfo`, the bytes a block device wrote from `/sys/dev/block`.

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
    /// Minor page faults (`ru_minflt`): first touches of memory the process had not used yet.
    pub minor_faults: u64,
}

impl Usage {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Usage) -> Usage {
        Usage {
            voluntary: self.voluntary.saturating_sub(earlier.voluntary),
            involuntary: self.involuntary.saturating_sub(earlier.involuntary),
            cpu_us: self.cpu_us.saturating_sub(earlier.cpu_us),
            minor_faults: self.minor_faults.saturating_sub(earlier.minor_faults),
        }
    }

    /// Adds `other` to `self`.
    pub fn add(&mut self, other: &Usage) {
        self.voluntary += other.voluntary;
        self.involuntary += other.involuntary;
        self.cpu_us += other.cpu_us;
        self.minor_faults += other.minor_faults;
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
        minor_faults: u64::try_from(usage.ru_minflt).unwrap_or(0),
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

/// The block device a directory lies on, whose kernel counters say how many bytes it wrote:
/// the truth of what a workload cost the disk (the log, the zeros of new log segments, data
/// pages, the file system's journal), as the device saw it. The counters are the whole
/// device's, so whatever else writes there meanwhile counts too. (Not `/proc/self/io`: its
/// `write_bytes` counts a whole page-cache folio each time one is dirtied, and with large
/// folios a 200-byte log append counted as 20 KiB.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockDevice {
    /// `/sys/dev/block/MAJOR:MINOR/stat`.
    stat_path: std::path::PathBuf,
}

impl BlockDevice {
    /// The device `dir` lies on; `None` on a file system without one (tmpfs), or where the
    /// kernel does not say (not Linux).
    pub fn of(dir: &std::path::Path) -> Option<BlockDevice> {
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::fs::MetadataExt;
            let device = std::fs::metadata(dir).ok()?.dev();
            let (major, minor) = (libc::major(device), libc::minor(device));
            let stat_path =
                std::path::PathBuf::from(format!("/sys/dev/block/{major}:{minor}/stat"));
            let device = BlockDevice { stat_path };
            device.written_bytes().map(|_| device)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = dir;
            None
        }
    }

    /// Bytes the device has written since it appeared: the seventh field of its `stat` file
    /// (sectors written, always in 512-byte units).
    pub fn written_bytes(&self) -> Option<u64> {
        let stat = std::fs::read_to_string(&self.stat_path).ok()?;
        let sectors: u64 = stat.split_whitespace().nth(6)?.parse().ok()?;
        Some(sectors * 512)
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

/// This process's and the machine's CPU counters at the start of a run, so that its report can
/// say how busy the rest of the machine was meanwhile (a busy machine makes rates noisy).
pub struct LoadProbe {
    process: Usage,
    machine: Option<MachineCpu>,
}

impl LoadProbe {
    /// Reads the counters now.
    pub fn start() -> LoadProbe {
        LoadProbe {
            process: process_usage(),
            machine: MachineCpu::now(),
        }
    }

    /// This process's counters since [`LoadProbe::start`], and the percentage of the machine's
    /// CPU other processes used meanwhile (rounded; `None` if unknown or too short to tell).
    pub fn finish(&self) -> (Usage, Option<f64>) {
        let usage = process_usage().since(&self.process);
        let other = self
            .machine
            .as_ref()
            .zip(MachineCpu::now())
            .and_then(|(before, after)| after.other_load_percent(before, usage.cpu_us as f64 / 1e6))
            .map(|percent| percent.round());
        (usage, other)
    }
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions; it only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// Returns the memory the allocator holds free to the kernel, so that the next run starts from
/// the same cold state as a fresh process: every page it needs is a fresh page (a page fault),
/// whatever ran before. Without this, whether a run reuses memory an earlier one freed depends
/// on glibc's per-thread arenas and on its dynamic thresholds (freeing a large buffer raises
/// the trim threshold to up to 64 MiB per arena): in one process, 8000-byte runs went at 150k
/// or 570k rows/s depending on what ran before them.
///
/// On glibc it pins the trim and mmap thresholds at their documented defaults (128 KiB, which
/// switches the dynamic adjustment off, so every arena gives back free memory at its top as a
/// fresh process's would) and calls `malloc_trim(0)` (free pages inside every arena). Returns
/// whether anything was done (glibc on Linux only).
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static FIXED_THRESHOLDS: std::sync::Once = std::sync::Once::new();
        FIXED_THRESHOLDS.call_once(|| {
            // SAFETY: mallopt only sets allocator tunables; it may be called at any time from
            // any thread and has no memory-safety preconditions.
            unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, 128 * 1024) };
            // SAFETY: as above.
            unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) };
        });
        // SAFETY: malloc_trim has no preconditions; it only gives free pages back to the kernel
        // and may be called at any time from any thread.
        unsafe { libc::malloc_trim(0) };
        true
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// The processor model (`model name` in `/proc/cpuinfo`), if the system names it.
pub fn cpu_model() -> Option<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = cpuinfo
        .lines()
        .find(|line| line.starts_with("model name"))?;
    let model = line
        .split_once(':')?
        .1
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    (!model.is_empty()).then_some(model)
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

    #[test]
    fn a_synced_write_is_counted_by_its_device() {
        let dir = std::env::current_dir().expect("the current directory");
        let Some(device) = BlockDevice::of(&dir) else {
            eprintln!(
                "{} lies on no block device here: nothing to check",
                dir.display()
            );
            return;
        };
        let before = device.written_bytes().expect("readable");
        let path = dir.join(format!("lastpage-device-count-{}", std::process::id()));
        let bytes = vec![7_u8; 256 << 10];
        {
            use std::io::Write;
            let mut file = std::fs::File::create(&path).expect("create");
            file.write_all(&bytes).expect("write");
            file.sync_data().expect("sync");
        }
        let after = device.written_bytes().expect("still readable");
        std::fs::remove_file(&path).expect("remove");
        // Whatever else writes to the device meanwhile only adds.
        assert!(
            after >= before + bytes.len() as u64,
            "the device counted {} bytes for a synced write of {}",
            after - before,
            bytes.len()
        );
    }

    #[test]
    fn memory_has_no_block_device() {
        assert_eq!(BlockDevice::of(std::path::Path::new("/proc")), None);
    }
}
