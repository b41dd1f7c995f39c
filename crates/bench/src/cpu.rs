//! Server CPU time per operation: the user and system time of a server's process tree
//! over a measured interval, divided by the operations completed in it.
//!
//! The time comes from `/proc/PID/stat` (fields `utime`, `stime`, `cutime`, `cstime`, in
//! clock ticks) of the server process and of every live descendant: nbd-server forks a
//! process per connection, and its children's time reaches the parent's `cutime` only
//! once they are reaped, so both the live descendants and the reaped ones are counted
//! (a process is never in both). The resolution is one clock tick (10 ms at the usual
//! 100 Hz), negligible over runs of seconds at thousands of operations per second.

use std::time::Instant;

use serde::{Deserialize, Serialize};

/// CPU time of a process tree at one instant.
#[derive(Debug, Clone, Copy)]
pub struct CpuSample {
    /// User plus system time of the tree, in seconds.
    pub cpu_seconds: f64,
    pub taken_at: Instant,
}

/// What a server's process tree used between two samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CpuUsage {
    /// CPU seconds per wall-clock second (1.0 is one core busy).
    pub cores: f64,
    /// Wall-clock seconds between the samples.
    pub interval_seconds: f64,
}

impl CpuUsage {
    /// The usage between `start` and `end`, or `None` when they coincide.
    pub fn between(start: &CpuSample, end: &CpuSample) -> Option<Self> {
        let interval_seconds = end.taken_at.duration_since(start.taken_at).as_secs_f64();
        (interval_seconds > 0.0).then(|| Self {
            cores: (end.cpu_seconds - start.cpu_seconds).max(0.0) / interval_seconds,
            interval_seconds,
        })
    }

    /// Microseconds of server CPU per operation at `operations_per_second`.
    pub fn microseconds_per_operation(&self, operations_per_second: f64) -> Option<f64> {
        (operations_per_second > 0.0).then(|| self.cores * 1e6 / operations_per_second)
    }
}

/// Clock ticks per second of `/proc/PID/stat` times.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf takes an integer name and has no memory-safety preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// The fields of `/proc/PID/stat` this module reads.
#[derive(Debug, Clone, Copy, PartialEq)]
struct StatFields {
    parent_pid: u32,
    /// utime + stime + cutime + cstime, in clock ticks.
    ticks: u64,
}

/// Parses one `/proc/PID/stat` line; the command name may hold spaces and brackets,
/// so fields are counted from the last `)`.
fn parse_stat(line: &str) -> Option<StatFields> {
    let (_, rest) = line.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    let parent_pid = fields.get(1)?.parse().ok()?;
    let mut ticks = 0u64;
    for index in 11..=14 {
        let value: i64 = fields.get(index)?.parse().ok()?;
        ticks += u64::try_from(value.max(0)).ok()?;
    }
    Some(StatFields { parent_pid, ticks })
}

fn read_stat(pid: u32) -> Option<StatFields> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Samples the CPU time of `pid` and its live descendants; `None` when `pid` is gone.
pub fn sample_tree(pid: u32) -> Option<CpuSample> {
    let root = read_stat(pid)?;
    let mut processes: Vec<(u32, StatFields)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(other) = entry
                .file_name()
                .to_str()
                .and_then(|name| name.parse().ok())
            else {
                continue;
            };
            if other != pid
                && let Some(fields) = read_stat(other)
            {
                processes.push((other, fields));
            }
        }
    }
    let mut tree = vec![pid];
    let mut ticks = root.ticks;
    // Descendants: repeatedly adopt processes whose parent is already in the tree.
    let mut grew = true;
    while grew {
        grew = false;
        processes.retain(|(other, fields)| {
            if tree.contains(&fields.parent_pid) {
                tree.push(*other);
                ticks += fields.ticks;
                grew = true;
                false
            } else {
                true
            }
        });
    }
    Some(CpuSample {
        cpu_seconds: ticks as f64 / ticks_per_second(),
        taken_at: Instant::now(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_names_parse() {
        let line = "1234 (a) b (c)) S 99 1234 1234 0 -1 4194560 100 0 0 0 \
                    250 50 7 3 20 0 1 0 100 0 0";
        let fields = parse_stat(line).expect("parses");
        assert_eq!(fields.parent_pid, 99);
        assert_eq!(fields.ticks, 250 + 50 + 7 + 3);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_busy_child_is_counted_in_its_parents_tree() {
        // A shell whose child spins: the shell itself is idle, the tree is not. The
        // spinner ends by itself (timeout), so stopping the shell leaves nothing behind.
        let mut command = std::process::Command::new("sh");
        command.args(["-c", "timeout 2 sh -c 'while :; do :; done'; wait"]);
        let mut child = crate::process::ManagedChild::spawn(command).expect("sh starts");
        let start = sample_tree(child.id()).expect("alive");
        std::thread::sleep(std::time::Duration::from_millis(600));
        let end = sample_tree(child.id()).expect("alive");
        let own = read_stat(child.id()).expect("alive").ticks;
        let usage = CpuUsage::between(&start, &end).expect("interval");
        child.stop();
        assert!(usage.cores > 0.2, "the spinning grandchild is counted");
        assert!(own as f64 / ticks_per_second() < 0.1, "the shell idles");
        // `cores * 1e6 / 1e6` may differ from `cores` in the last bit: equal
        // to within rounding, not bit for bit.
        let per_operation = usage
            .microseconds_per_operation(1e6)
            .expect("a positive rate");
        assert!(
            (per_operation - usage.cores).abs() <= usage.cores * 1e-12,
            "one operation per microsecond costs `cores` microseconds: {per_operation} against {}",
            usage.cores
        );
        assert_eq!(usage.microseconds_per_operation(0.0), None);
    }
}
