// The clock every stage reads: wall-clock time in unix milliseconds (records, points, alerts and
// the store all speak it). Kernel, so that no stage borrows it from another.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in milliseconds since the unix epoch (0 if the system clock is before it).
pub fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn now_is_after_2025_and_moves_forward() {
        let a = super::now_unix_ms();
        assert!(a > 1_735_689_600_000, "{a}");
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(super::now_unix_ms() > a);
    }
}
