// A thread's scheduler slice on Linux (EEVDF, 6.12+): the one system call tokenwatch makes that
// no maintained crate wraps (rustix, nix and thread-priority set policies and niceness, not this).

//! Under EEVDF a thread's slice sets its virtual deadline: a thread with a short slice that
//! wakes preempts a thread with a longer one at once, rather than after the running thread's
//! slice, while its share of the CPU stays what its niceness gives it. tokenwatch gives its
//! proxy threads a short slice so a forwarded chunk does not wait behind analysis work on the
//! same CPU, without starving analysis the way SCHED_IDLE can.

use std::time::Duration;

/// The shortest and longest slices the kernel takes (it clamps a request to this range).
pub const MIN_SLICE: Duration = Duration::from_micros(100);
pub const MAX_SLICE: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum SliceError {
    #[error("the kernel refused the scheduler slice: {0}")]
    Os(#[from] std::io::Error),
    #[error("this kernel keeps no scheduler slice per thread (Linux 6.12 or later does)")]
    Unsupported,
    #[error("the thread is not under a normal (SCHED_OTHER or SCHED_BATCH) policy")]
    NotFair,
    #[error("a slice must be {min}–{max} µs, got {0:?}", min = MIN_SLICE.as_micros(), max = MAX_SLICE.as_micros())]
    OutOfRange(Duration),
}

/// Ask for `slice` on the calling thread, keeping its policy and niceness.
pub fn set_current_thread_slice(slice: Duration) -> Result<(), SliceError> {
    if !(MIN_SLICE..=MAX_SLICE).contains(&slice) {
        return Err(SliceError::OutOfRange(slice));
    }
    sys::set_slice(slice)?;
    match current_thread_slice()? {
        Some(now) if now == slice => Ok(()),
        // An older kernel takes the call and ignores the slice of a normal thread.
        _ => Err(SliceError::Unsupported),
    }
}

/// The calling thread's slice; `None` where the kernel keeps none per thread (before 6.12).
pub fn current_thread_slice() -> Result<Option<Duration>, SliceError> {
    sys::slice()
}

#[cfg(target_os = "linux")]
mod sys {
    use super::SliceError;
    use std::time::Duration;

    const SCHED_OTHER: u32 = 0;
    const SCHED_BATCH: u32 = 3;
    const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

    /// The kernel's `struct sched_attr` (include/uapi/linux/sched/types.h), its first
    /// published size (SCHED_ATTR_SIZE_VER1, 56 bytes).
    #[repr(C)]
    #[derive(Default)]
    struct SchedAttr {
        size: u32,
        sched_policy: u32,
        sched_flags: u64,
        sched_nice: i32,
        sched_priority: u32,
        sched_runtime: u64,
        sched_deadline: u64,
        sched_period: u64,
        sched_util_min: u32,
        sched_util_max: u32,
    }

    const SIZE: u32 = std::mem::size_of::<SchedAttr>() as u32;
    const _: () = assert!(SIZE == 56);

    #[allow(unsafe_code)]
    fn get() -> Result<SchedAttr, SliceError> {
        let mut attr = SchedAttr::default();
        // SAFETY: `attr` is a live, writable `sched_attr` of the size passed; the kernel writes
        // at most that many bytes into it. Thread id 0 is the calling thread.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_sched_getattr,
                0,
                &mut attr as *mut SchedAttr,
                SIZE,
                0,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(attr)
    }

    /// The calling thread's attributes, if it is under a fair (normal) policy, the only ones
    /// whose slice the kernel keeps per thread.
    fn get_fair() -> Result<SchedAttr, SliceError> {
        let attr = get()?;
        if attr.sched_policy != SCHED_OTHER && attr.sched_policy != SCHED_BATCH {
            return Err(SliceError::NotFair);
        }
        Ok(attr)
    }

    pub(super) fn slice() -> Result<Option<Duration>, SliceError> {
        let attr = get_fair()?;
        Ok((attr.sched_runtime > 0).then(|| Duration::from_nanos(attr.sched_runtime)))
    }

    #[allow(unsafe_code)]
    pub(super) fn set_slice(slice: Duration) -> Result<(), SliceError> {
        let now = get_fair()?;
        let attr = SchedAttr {
            size: SIZE,
            sched_policy: now.sched_policy,
            sched_flags: now.sched_flags & SCHED_FLAG_RESET_ON_FORK,
            sched_nice: now.sched_nice,
            sched_runtime: u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX),
            ..SchedAttr::default()
        };
        // SAFETY: `attr` is a live, initialised `sched_attr` whose `size` field says how much
        // the kernel may read; the kernel only reads it. Thread id 0 is the calling thread.
        let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(())
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use super::SliceError;
    use std::time::Duration;

    pub(super) fn slice() -> Result<Option<Duration>, SliceError> {
        Ok(None)
    }

    pub(super) fn set_slice(_: Duration) -> Result<(), SliceError> {
        Err(SliceError::Unsupported)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether this kernel keeps a slice per thread (6.12+): the tests below then check it was
    /// set; elsewhere that setting it says so.
    fn kernel_has_slices() -> bool {
        matches!(current_thread_slice(), Ok(Some(_)))
    }

    #[test]
    fn a_thread_gets_the_slice_it_asks_for_and_keeps_its_niceness() {
        std::thread::spawn(|| {
            // A niceness other than 0, so a call that reset it would show.
            let tid = rustix::thread::gettid();
            let base = rustix::process::getpriority_process(Some(tid)).unwrap();
            rustix::process::setpriority_process(Some(tid), base + 5).unwrap();
            let nice_before = std::fs::read_to_string("/proc/thread-self/stat")
                .ok()
                .map(|s| field(&s, 19));
            assert_eq!(nice_before, Some((base + 5).to_string()));
            let set = set_current_thread_slice(Duration::from_micros(250));
            if kernel_has_slices() {
                set.expect("slice set");
                assert_eq!(
                    current_thread_slice().unwrap(),
                    Some(Duration::from_micros(250))
                );
                // /proc agrees (se.slice, in ns).
                let sched = std::fs::read_to_string("/proc/thread-self/sched").unwrap();
                let line = sched
                    .lines()
                    .find(|l| l.starts_with("se.slice"))
                    .expect("se.slice");
                assert!(line.trim_end().ends_with("250000"), "{line}");
            } else {
                assert!(matches!(set, Err(SliceError::Unsupported)), "{set:?}");
            }
            let nice_after = std::fs::read_to_string("/proc/thread-self/stat")
                .ok()
                .map(|s| field(&s, 19));
            assert_eq!(nice_before, nice_after);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn slices_outside_the_kernels_range_are_refused_before_the_call() {
        for bad in [
            Duration::ZERO,
            Duration::from_micros(99),
            Duration::from_millis(101),
        ] {
            assert!(
                matches!(set_current_thread_slice(bad), Err(SliceError::OutOfRange(d)) if d == bad)
            );
        }
    }

    /// Field `n` (1-based) of a `/proc/.../stat` line, counted after the command name.
    fn field(stat: &str, n: usize) -> String {
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        after.split(' ').nth(n - 3).unwrap_or_default().to_string()
    }
}
