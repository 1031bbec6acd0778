//! Long synchronous work of a request (decoding, patching, admitting or encoding a large object)
//! runs off the async workers and at most on all cores but one, so that one tenant's large
//! requests cannot queue every other request behind them: the async workers keep a core for
//! everyone else, as kube-apiserver's goroutines are preempted and its priority-and-fairness
//! queues keep one user from taking every seat.

use std::sync::Arc;

use tokio::sync::Semaphore;

/// Work on more bytes than this is heavy.
const HEAVY_BYTES: usize = 64 * 1024;

/// Seats for heavy work (clones share the seats).
#[derive(Debug, Clone)]
pub struct HeavyWork {
    seats: Arc<Semaphore>,
}

impl Default for HeavyWork {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        HeavyWork {
            seats: Arc::new(Semaphore::new(cores.saturating_sub(1).max(1))),
        }
    }
}

impl HeavyWork {
    /// Runs `f`, synchronous work over `bytes` bytes of input. Beyond [`HEAVY_BYTES`] on a
    /// multi-threaded runtime it first waits for a seat, then runs in place of a blocking thread
    /// (the runtime hands this worker's other tasks to a fresh worker).
    pub async fn run<T>(&self, bytes: usize, f: impl FnOnce() -> T) -> T {
        if bytes <= HEAVY_BYTES || !on_multi_thread_runtime() {
            return f();
        }
        // The semaphore is never closed, so a seat always comes.
        let _seat = self.seats.acquire().await;
        tokio::task::block_in_place(|| {
            let _lowered = LoweredPriority::new();
            f()
        })
    }

    /// Runs `f`, a copy of `bytes` bytes (no parsing), off the async workers when it is large
    /// enough to hold one for milliseconds; it takes no seat, as copies are short and many may
    /// run at once.
    pub fn copy<T>(&self, bytes: usize, f: impl FnOnce() -> T) -> T {
        if bytes > LARGE_COPY_BYTES && on_multi_thread_runtime() {
            tokio::task::block_in_place(f)
        } else {
            f()
        }
    }
}

/// How far heavy work lowers its thread's priority (nice steps).
const HEAVY_NICE: i32 = 10;

/// The calling thread's CPU priority lowered by [`HEAVY_NICE`] for as long as this lives, so that
/// the kernel gives a core to an async worker woken by a short request at once instead of at the
/// end of the heavy work's time slice: light requests are then not delayed by the milliseconds
/// of a large object's decoding, and heavy work still gets every core nobody else wants.
struct LoweredPriority {
    before: Option<i32>,
}

impl LoweredPriority {
    /// Lowers the priority only where it can be raised back: without `CAP_SYS_NICE` (or a
    /// `RLIMIT_NICE` that allows it) a thread may lower its priority but never raise it again,
    /// and a worker left lowered would slow every request it serves afterwards.
    fn new() -> Self {
        let before = thread_nice().filter(|_| priority_can_be_restored());
        if let Some(n) = before {
            set_thread_nice((n + HEAVY_NICE).min(19));
        }
        LoweredPriority { before }
    }
}

impl Drop for LoweredPriority {
    fn drop(&mut self) {
        if let Some(n) = self.before {
            set_thread_nice(n);
        }
    }
}

/// Whether this process may raise a thread's priority back after lowering it: tried once, on a
/// thread of its own (a new thread starts at its creator's nice value).
fn priority_can_be_restored() -> bool {
    static CAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CAN.get_or_init(|| {
        std::thread::spawn(|| {
            let Some(n) = thread_nice().filter(|n| *n < 19) else {
                return false;
            };
            set_thread_nice(n + 1) && set_thread_nice(n) && thread_nice() == Some(n)
        })
        .join()
        .unwrap_or(false)
    })
}

/// The calling thread's nice value (Linux keeps one per thread), if it can be read.
#[cfg(target_os = "linux")]
fn thread_nice() -> Option<i32> {
    // SAFETY: errno is thread-local; getpriority only reads the calling thread's (who = 0) nice
    // value. -1 is a valid nice value, so errno tells an error from it.
    unsafe {
        *libc::__errno_location() = 0;
        let n = libc::getpriority(libc::PRIO_PROCESS, 0);
        (n != -1 || *libc::__errno_location() == 0).then_some(n)
    }
}

#[cfg(not(target_os = "linux"))]
fn thread_nice() -> Option<i32> {
    None
}

/// Sets the calling thread's nice value; whether it was allowed.
#[cfg(target_os = "linux")]
fn set_thread_nice(n: i32) -> bool {
    // SAFETY: setpriority with who = 0 changes the calling thread's nice value only.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, n) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn set_thread_nice(_: i32) -> bool {
    false
}

/// Whether this runs on a multi-threaded runtime, the only kind `block_in_place` works on.
fn on_multi_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Copies of more bytes than this leave the async workers.
const LARGE_COPY_BYTES: usize = 32 * 1024 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn heavy_work_takes_turns_and_light_work_does_not_wait() {
        let heavy = Arc::new(HeavyWork {
            seats: Arc::new(Semaphore::new(1)),
        });
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let (heavy, running, most) = (heavy.clone(), running.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                heavy
                    .run(1 << 20, || {
                        let now = running.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    })
                    .await
            }));
        }
        // Light work runs at once, whatever the seats.
        assert_eq!(heavy.run(10, || 7).await, 7);
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// Heavy work runs at a lower CPU priority than the async workers and gives the thread back
    /// at the priority it had; light work keeps it.
    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn heavy_work_yields_the_cpu_to_light_work_and_restores_its_thread() {
        let heavy = HeavyWork::default();
        let before = thread_nice().expect("nice value");
        let during = heavy.run(1 << 20, thread_nice).await;
        if priority_can_be_restored() {
            assert_eq!(during, Some((before + HEAVY_NICE).min(19)));
        } else {
            // Without the right to raise it back, the priority is left alone.
            assert_eq!(during, Some(before));
        }
        // block_in_place returns on the thread it ran on: its priority is back.
        assert_eq!(thread_nice(), Some(before));
        assert_eq!(heavy.run(10, thread_nice).await, Some(before));
    }

    /// The same test as a user without the right to raise a priority (`nobody`), where a
    /// lowered worker could never be raised back: run by root, it runs this test binary again
    /// as `nobody` (util-linux `setpriv`); run by anyone else, the test above already is that.
    #[cfg(target_os = "linux")]
    #[test]
    fn without_the_right_to_raise_it_no_thread_is_left_lowered() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        // A copy nobody can reach, wherever the build put the test binary.
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let exe = dir.path().join("heavy-tests");
        std::fs::copy(std::env::current_exe().expect("the test binary"), &exe)
            .expect("copying the test binary");
        for (path, mode) in [(dir.path(), 0o755), (exe.as_path(), 0o755)] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .expect("opening the copy to nobody");
        }
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
            .arg(&exe)
            .args([
                "--exact",
                "meta::heavy::tests::heavy_work_yields_the_cpu_to_light_work_and_restores_its_thread",
            ])
            .output()
            .expect("setpriv (util-linux) runs the test as nobody");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "as nobody: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
