// The queue each model's kept records live in: fixed-size chunks (memory follows the records
// kept, never twice that after a burst) that know their time span, so a window skips whole chunks;
// and the kept state's figures on `/metrics` (records evicted at the per-model cap, bytes kept).

use crate::export::prometheus::Metrics;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::VecDeque;

/// Records per chunk: at ~250 bytes a record, 256 KiB; a model's queue holds at most two
/// chunks' worth of unused room.
pub const CHUNK: usize = 1024;

/// What the queue needs of an item: when it became known.
pub trait Timed {
    fn at_ms(&self) -> i64;
}

#[derive(Debug, Clone)]
struct Chunk<T> {
    items: VecDeque<T>,
    /// Bounds of the `at_ms` of every item pushed (items popped since only narrow the real
    /// span, so the bounds stay safe to skip by).
    min_at: i64,
    max_at: i64,
}

/// A FIFO of items in arrival order (mostly, not strictly, in time order), in chunks of
/// `CHUNK`.
#[derive(Debug, Clone)]
pub struct KeptQueue<T> {
    chunks: VecDeque<Chunk<T>>,
    len: usize,
}

impl<T> Default for KeptQueue<T> {
    fn default() -> Self {
        KeptQueue {
            chunks: VecDeque::new(),
            len: 0,
        }
    }
}

impl<T: Timed> KeptQueue<T> {
    pub fn push_back(&mut self, item: T) {
        let at = item.at_ms();
        match self.chunks.back_mut() {
            Some(c) if c.items.len() < CHUNK => {
                c.min_at = c.min_at.min(at);
                c.max_at = c.max_at.max(at);
                c.items.push_back(item);
            }
            _ => {
                let mut items = VecDeque::with_capacity(CHUNK);
                items.push_back(item);
                self.chunks.push_back(Chunk {
                    items,
                    min_at: at,
                    max_at: at,
                });
            }
        }
        self.len += 1;
    }

    pub fn pop_front(&mut self) -> Option<T> {
        let first = self.chunks.front_mut()?;
        let item = first.items.pop_front();
        if first.items.is_empty() {
            self.chunks.pop_front();
        }
        if item.is_some() {
            self.len -= 1;
        }
        item
    }

    pub fn front(&self) -> Option<&T> {
        self.chunks.front().and_then(|c| c.items.front())
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Items in order, skipping chunks wholly outside `(from, to]` (an item of a chunk that
    /// is not skipped may still be outside: callers filter).
    pub fn overlapping(&self, from: i64, to: i64) -> impl Iterator<Item = &T> {
        self.chunks
            .iter()
            .filter(move |c| c.max_at > from && c.min_at <= to)
            .flat_map(|c| c.items.iter())
    }

    /// Every item, in order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flat_map(|c| c.items.iter())
    }

    /// The items from the `start`-th on, in order (whole chunks before it are skipped).
    pub fn iter_from(&self, start: usize) -> impl Iterator<Item = &T> {
        let mut skip = start;
        let mut first = self.chunks.len();
        for (k, c) in self.chunks.iter().enumerate() {
            if skip < c.items.len() {
                first = k;
                break;
            }
            skip -= c.items.len();
        }
        self.chunks
            .range(first..)
            .enumerate()
            .flat_map(move |(k, c)| c.items.range(if k == 0 { skip } else { 0 }..))
    }

    /// Room allocated, in items (what the queue's memory follows).
    pub fn capacity(&self) -> usize {
        self.chunks.iter().map(|c| c.items.capacity()).sum()
    }
}

/// About the bytes a hash table (`HashMap`, `HashSet`) of `T` with room for `capacity`
/// allocates: its buckets (usable room is 7/8 of them) of one `T` and one control byte each.
pub fn table_bytes<T>(capacity: usize) -> usize {
    capacity.div_ceil(7) * 8 * (size_of::<T>() + 1)
}

/// The engine's kept analysis state on `/metrics`, set by the engine after each evaluation
/// (prometheus-client's metrics are atomics: the scrape reads them from another thread).
pub struct KeptMetrics {
    evicted: Counter,
    bytes: Gauge,
    /// The engine's eviction count at the last `publish` (the counter takes the difference).
    evicted_seen: u64,
}

impl KeptMetrics {
    pub fn register(m: &Metrics) -> KeptMetrics {
        let k = KeptMetrics {
            evicted: Counter::default(),
            bytes: Gauge::default(),
            evicted_seen: 0,
        };
        m.register(
            "tokenwatch_alerting_evicted_records",
            "Request records the alert engine dropped before their retention ran out because \
             their model had alerting.max_records_per_model kept",
            k.evicted.clone(),
        );
        m.register(
            "tokenwatch_alerting_kept_bytes",
            "Bytes the alert engine holds per request: the request records and first tokens its \
             windows read, the latency and A/B windows' mirrored samples, the request ids that \
             join scores and the prefix-cache accesses (labels shared between records not \
             counted)",
            k.bytes.clone(),
        );
        k
    }

    /// Publish the engine's figures: `evicted_total`, its eviction count since start (a count
    /// below the last one, after the kept state was rebuilt, counts from zero again), and
    /// `kept_bytes` now.
    pub fn publish(&mut self, evicted_total: u64, kept_bytes: usize) {
        let new = evicted_total
            .checked_sub(self.evicted_seen)
            .unwrap_or(evicted_total);
        self.evicted.inc_by(new);
        self.evicted_seen = evicted_total;
        self.bytes
            .set(i64::try_from(kept_bytes).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Timed for (i64, u32) {
        fn at_ms(&self) -> i64 {
            self.0
        }
    }

    #[test]
    fn fifo_order_length_and_bounded_room() {
        let mut q = KeptQueue::default();
        let n = 5 * CHUNK + 7;
        for i in 0..n {
            q.push_back((i as i64, i as u32));
        }
        assert_eq!(q.len(), n);
        assert!(q.capacity() >= n && q.capacity() <= n + CHUNK);
        for i in 0..2 * CHUNK + 3 {
            assert_eq!(q.pop_front(), Some((i as i64, i as u32)));
        }
        assert_eq!(
            q.front(),
            Some(&((2 * CHUNK + 3) as i64, (2 * CHUNK + 3) as u32))
        );
        assert_eq!(q.len(), n - 2 * CHUNK - 3);
        // The emptied chunks were given back.
        assert!(q.capacity() <= q.len() + 2 * CHUNK);
        let all: Vec<u32> = q.iter().map(|x| x.1).collect();
        assert_eq!(all, ((2 * CHUNK + 3) as u32..n as u32).collect::<Vec<_>>());
        while q.pop_front().is_some() {}
        assert!(q.is_empty() && q.capacity() == 0 && q.front().is_none());
    }

    #[test]
    fn metrics_count_evictions_once_and_show_bytes_kept() {
        let m = Metrics::new();
        let mut k = KeptMetrics::register(&m);
        let read = |name: &str| -> Option<f64> {
            m.encode()
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        };
        k.publish(0, 0);
        assert_eq!(read("tokenwatch_alerting_evicted_records_total"), Some(0.0));
        assert_eq!(read("tokenwatch_alerting_kept_bytes"), Some(0.0));
        k.publish(7, 4096);
        k.publish(7, 8192);
        k.publish(10, 1024);
        assert_eq!(
            read("tokenwatch_alerting_evicted_records_total"),
            Some(10.0)
        );
        assert_eq!(read("tokenwatch_alerting_kept_bytes"), Some(1024.0));
        // The engine's count started again (its kept state was rebuilt): counted on top.
        k.publish(2, 0);
        assert_eq!(
            read("tokenwatch_alerting_evicted_records_total"),
            Some(12.0)
        );
    }

    #[test]
    fn windows_skip_chunks_outside_and_keep_out_of_order_items() {
        let mut q = KeptQueue::default();
        for i in 0..4 * CHUNK {
            // Every 100th item is late: known long after the items around it.
            let at = if i % 100 == 0 {
                1_000_000 + i as i64
            } else {
                i as i64
            };
            q.push_back((at, i as u32));
        }
        let naive = |from: i64, to: i64| -> Vec<u32> {
            q.iter()
                .filter(|x| x.0 > from && x.0 <= to)
                .map(|x| x.1)
                .collect()
        };
        let fast = |from: i64, to: i64| -> Vec<u32> {
            q.overlapping(from, to)
                .filter(|x| x.0 > from && x.0 <= to)
                .map(|x| x.1)
                .collect()
        };
        for (from, to) in [
            (0, 10),
            (CHUNK as i64 - 5, CHUNK as i64 + 5),
            (3 * CHUNK as i64, 4 * CHUNK as i64),
            (999_999, 2_000_000),
            (-5, i64::MAX),
        ] {
            assert_eq!(fast(from, to), naive(from, to), "({from}, {to}]");
        }
        // A window early in the second chunk reads the first two chunks (the first holds items
        // that late, the second spans to its own late items) and skips the last two.
        let read = q.overlapping(CHUNK as i64 + 10, CHUNK as i64 + 20).count();
        assert_eq!(read, 2 * CHUNK);
        assert_eq!(q.overlapping(5_000_000, 6_000_000).count(), 0);
    }
}
