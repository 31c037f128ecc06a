// The wait between retries, for every retry loop of the product (alert delivery, telemetry
// export, the ClickHouse client): the first wait, doubled after each retry up to a ceiling.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// Waits `first`, then twice as long after each retry, never longer than `max`.
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            next: first.min(max),
            max,
        }
    }

    /// The wait before the coming retry, without advancing.
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// The wait before the coming retry; the one after is twice as long (up to the ceiling).
    pub fn next_delay(&mut self) -> Duration {
        let now = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_ceiling_and_stays_there() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(1000));
        let waits: Vec<Duration> = (0..7).map(|_| b.next_delay()).collect();
        assert_eq!(
            waits,
            vec![
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1000),
                ms(1000),
                ms(1000)
            ]
        );
        assert_eq!(b.peek(), ms(1000));
    }

    #[test]
    fn a_first_wait_above_the_ceiling_is_the_ceiling_and_huge_waits_do_not_overflow() {
        let mut b = Backoff::new(Duration::from_secs(60), Duration::from_secs(10));
        assert_eq!(b.next_delay(), Duration::from_secs(10));
        let mut big = Backoff::new(Duration::MAX / 2 + Duration::from_secs(1), Duration::MAX);
        big.next_delay();
        assert_eq!(big.peek(), Duration::MAX);
    }
}
