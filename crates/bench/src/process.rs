//! Child processes the benchmark starts (servers, fio, helpers) and the Ctrl-C handling
//! that guarantees none of them outlives `lamina bench`.
//!
//! Every long-lived child is registered here by PID. Servers run in their own process
//! group so that a Ctrl-C typed at the terminal does not kill them behind our back
//! (we must stop them ourselves, in order, and know that they are gone); on Linux they
//! also get `PR_SET_PDEATHSIG` so that even a SIGKILL of `lamina bench` takes them down.
//! The interrupt handler only sends SIGTERM to registered PIDs and sets a flag; the
//! main thread notices the flag, and the `Drop` of each [`ManagedChild`] waits for the
//! child and escalates to SIGKILL after [`STOP_GRACE_MS`].

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

/// How long a child gets between SIGTERM and SIGKILL.
pub const STOP_GRACE_MS: u64 = 5_000;

/// How often a stopping child is polled for exit.
const STOP_POLL_INTERVAL_MS: u64 = 20;

/// PIDs of the children started by this process that are still running.
static REGISTERED_PIDS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// Set once Ctrl-C (SIGINT) or SIGTERM was received.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

static INSTALL_HANDLER: Once = Once::new();

/// Errors starting or stopping a child process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("cannot start `{program}`: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("waiting for `{program}` (pid {pid}) failed: {source}")]
    Wait {
        program: String,
        pid: u32,
        source: std::io::Error,
    },
    #[error("interrupted by a signal; started processes were stopped")]
    Interrupted,
}

/// Installs the SIGINT/SIGTERM handler once; later calls do nothing.
pub fn install_interrupt_handler() {
    INSTALL_HANDLER.call_once(|| {
        let result = ctrlc::set_handler(|| {
            INTERRUPTED.store(true, Ordering::SeqCst);
            let pids: Vec<u32> = match REGISTERED_PIDS.lock() {
                Ok(guard) => guard.iter().copied().collect(),
                Err(poisoned) => poisoned.into_inner().iter().copied().collect(),
            };
            for pid in pids {
                send_signal(pid, libc::SIGTERM);
            }
        });
        if let Err(error) = result {
            eprintln!("warning: cannot install the Ctrl-C handler: {error}");
        }
    });
}

/// True once an interrupt was received.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Returns `Err(Interrupted)` once an interrupt was received, so loops can use `?`.
pub fn check_interrupted() -> Result<(), ProcessError> {
    if interrupted() {
        Err(ProcessError::Interrupted)
    } else {
        Ok(())
    }
}

fn send_signal(pid: u32, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    assert!(
        pid > 0,
        "refusing to signal a process group or every process"
    );
    // SAFETY: kill(2) has no memory-safety preconditions; the PID is one we spawned
    // and have not yet reaped, so it cannot have been recycled for another process.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// A child process that is registered for Ctrl-C handling and stopped on drop.
#[derive(Debug)]
pub struct ManagedChild {
    program: String,
    child: Option<Child>,
}

impl ManagedChild {
    /// Starts `command` in its own process group with a parent-death signal.
    pub fn spawn(mut command: Command) -> Result<Self, ProcessError> {
        let program = command.get_program().to_string_lossy().into_owned();
        command.process_group(0);
        // SAFETY: the closure runs between fork and exec and calls only prctl(2),
        // which is async-signal-safe; it allocates nothing and touches no locks.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // Registration happens under the lock before the handler can see a half-started
        // child, so a Ctrl-C between spawn and registration cannot leak it.
        let mut pids = REGISTERED_PIDS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let child = command.spawn().map_err(|source| ProcessError::Spawn {
            program: program.clone(),
            source,
        })?;
        pids.insert(child.id());
        drop(pids);
        if interrupted() {
            send_signal(child.id(), libc::SIGTERM);
        }
        Ok(Self {
            program,
            child: Some(child),
        })
    }

    /// The PID of the child.
    pub fn id(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The underlying child, for reading its pipes.
    pub fn child_mut(&mut self) -> &mut Child {
        self.child.as_mut().expect("child is present until stopped")
    }

    /// Returns the exit status if the child has already exited.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>, ProcessError> {
        let program = self.program.clone();
        let child = self.child_mut();
        let pid = child.id();
        child.try_wait().map_err(|source| ProcessError::Wait {
            program,
            pid,
            source,
        })
    }

    /// Waits for the child to exit by itself and unregisters it.
    pub fn wait(mut self) -> Result<std::process::Output, ProcessError> {
        let child = self.child.take().expect("child is present until stopped");
        let pid = child.id();
        let output = child.wait_with_output();
        unregister(pid);
        output.map_err(|source| ProcessError::Wait {
            program: self.program.clone(),
            pid,
            source,
        })
    }

    /// Sends SIGINT, as Ctrl-C would (fio then writes its logs and its report), and
    /// waits for the child to exit.
    pub fn interrupt(self) -> Result<std::process::Output, ProcessError> {
        send_signal(self.id(), libc::SIGINT);
        self.wait()
    }

    /// Sends SIGTERM, waits up to [`STOP_GRACE_MS`], then SIGKILLs; always reaps.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let pid = child.id();
        let status = match child.try_wait() {
            Ok(Some(status)) => Some(status),
            _ => {
                send_signal(pid, libc::SIGTERM);
                let deadline = Instant::now() + Duration::from_millis(STOP_GRACE_MS);
                loop {
                    match child.try_wait() {
                        Ok(Some(status)) => break Some(status),
                        Ok(None) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(STOP_POLL_INTERVAL_MS));
                        }
                        _ => {
                            let _ = child.kill();
                            break child.wait().ok();
                        }
                    }
                }
            }
        };
        unregister(pid);
        status
    }
}

impl Drop for ManagedChild {
    fn drop(&mut self) {
        self.stop();
    }
}

fn unregister(pid: u32) {
    REGISTERED_PIDS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .remove(&pid);
}

/// Makes this process the reaper of orphaned descendants, so that a server that
/// daemonizes (nbd-server) becomes our child again and can be waited for by PID.
pub fn become_subreaper() {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) takes integer arguments only.
    let result = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
    if result != 0 {
        eprintln!(
            "warning: cannot become a subreaper: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// A server that daemonized and wrote its PID to a file: we started it, so we may stop it.
#[derive(Debug)]
pub struct DaemonProcess {
    pid: Option<u32>,
}

impl DaemonProcess {
    /// Reads the PID the daemon wrote to `pid_file`, waiting up to `timeout` for it.
    pub fn from_pid_file(pid_file: &std::path::Path, timeout: Duration) -> anyhow::Result<Self> {
        let deadline = Instant::now() + timeout;
        loop {
            check_interrupted()?;
            if let Ok(text) = std::fs::read_to_string(pid_file)
                && let Ok(pid) = text.trim().parse::<u32>()
                && pid > 1
            {
                REGISTERED_PIDS
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .insert(pid);
                return Ok(Self { pid: Some(pid) });
            }
            if Instant::now() > deadline {
                anyhow::bail!("no PID appeared in {}", pid_file.display());
            }
            std::thread::sleep(Duration::from_millis(STOP_POLL_INTERVAL_MS));
        }
    }

    /// The daemon's PID, until it is stopped.
    pub fn id(&self) -> Option<u32> {
        self.pid
    }

    /// SIGTERM, then SIGKILL after [`STOP_GRACE_MS`]; reaps it when it is our child.
    pub fn stop(&mut self) {
        let Some(pid) = self.pid.take() else {
            return;
        };
        let deadline = Instant::now() + Duration::from_millis(STOP_GRACE_MS);
        send_signal(pid, libc::SIGTERM);
        let mut killed = false;
        while !daemon_gone(pid) {
            if Instant::now() > deadline && !killed {
                send_signal(pid, libc::SIGKILL);
                killed = true;
            }
            std::thread::sleep(Duration::from_millis(STOP_POLL_INTERVAL_MS));
        }
        unregister(pid);
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// True once `pid` has exited: reaped by us (as subreaper), a zombie of someone else,
/// or no longer present.
fn daemon_gone(pid: u32) -> bool {
    let Ok(raw_pid) = libc::pid_t::try_from(pid) else {
        return true;
    };
    let mut status: libc::c_int = 0;
    // SAFETY: waitpid writes only to `status`, a valid local.
    let waited = unsafe { libc::waitpid(raw_pid, &mut status, libc::WNOHANG) };
    if waited == raw_pid {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// Finds `program` on `PATH`, as a shell would.
pub fn find_program(program: &str) -> Option<std::path::PathBuf> {
    if program.contains('/') {
        let path = std::path::PathBuf::from(program);
        return path.is_file().then_some(path);
    }
    let path_variable = std::env::var_os("PATH")?;
    std::env::split_paths(&path_variable)
        .map(|directory| directory.join(program))
        .find(|candidate| candidate.is_file())
}

/// Runs a short helper command to completion and fails with its stderr if it fails.
pub fn run_helper(mut command: Command) -> anyhow::Result<std::process::Output> {
    let description = format!("{command:?}");
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = ManagedChild::spawn(command)?;
    let output = child.wait()?;
    check_interrupted()?;
    if !output.status.success() {
        anyhow::bail!(
            "{description} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(output)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_terminates_and_unregisters_a_child() {
        let mut command = Command::new("sleep");
        command.arg("30");
        let mut child = ManagedChild::spawn(command).expect("sleep starts");
        let pid = child.id();
        assert!(REGISTERED_PIDS.lock().unwrap().contains(&pid));
        let status = child.stop().expect("status");
        assert!(!status.success());
        assert!(!REGISTERED_PIDS.lock().unwrap().contains(&pid));
    }

    #[test]
    fn find_program_finds_sh_and_not_nonsense() {
        assert!(find_program("sh").is_some());
        assert!(find_program("no-such-program-lamina-bench").is_none());
    }
}
