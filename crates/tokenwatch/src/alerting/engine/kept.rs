// The queue each model's kept records live in: fixed-size chunks (memory follows the records
// kept, never twice that after a burst) that know their time span, so a window skips whole chunks;
// and the kept state's figures on `/metrics` (records evicted at the per-model cap, bytes kept).

use super::thin::{Cuts, sample_id};
use crate::kernel::telemetry::Metrics;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::VecDeque;

/// Records per chunk: at ~250 bytes a record, 256 KiB; a model's queue holds at most two
/// chunks' worth of unused room.
pub const CHUNK: usize = 1024;

/// What the queue needs of an item: when it became known, and its push sequence (ascending
/// in the queue, so that thinned queues are still read from a sequence on).
pub trait Timed {
    /// Its source in sample ids (`thin::sample_id`).
    const SOURCE: u64;
    fn at_ms(&self) -> i64;
    fn seq(&self) -> u64;
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

    /// The items pushed at or after push sequence `seq`, in order (whole chunks before it are
    /// skipped).
    pub fn from_seq(&self, seq: u64) -> impl Iterator<Item = &T> {
        let first = self
            .chunks
            .partition_point(|c| c.items.back().is_none_or(|x| x.seq() < seq));
        self.chunks
            .range(first..)
            .enumerate()
            .flat_map(move |(k, c)| {
                let skip = match k {
                    0 => c.items.partition_point(|x| x.seq() < seq),
                    _ => 0,
                };
                c.items.range(skip..)
            })
    }

    /// Drop the items `now` thins that `before` (what the queue was thinned by so far) did not,
    /// each handed to `dropped`; chunks no cut moved across are not read. How many went.
    pub fn thin(&mut self, before: &Cuts, now: &Cuts, mut dropped: impl FnMut(&T)) -> usize {
        if !now.moved_since(before) {
            return 0;
        }
        let mut gone = 0;
        for c in self.chunks.iter_mut() {
            if !now.moved_across(before, c.min_at, c.max_at) {
                continue;
            }
            let n = c.items.len();
            c.items.retain(|x| {
                let keep = now.keeps(x.at_ms(), sample_id(x.seq(), T::SOURCE));
                if !keep {
                    dropped(x);
                }
                keep
            });
            gone += n - c.items.len();
            if c.items.capacity() > 2 * c.items.len() + 16 {
                c.items.shrink_to_fit();
            }
        }
        self.chunks.retain(|c| !c.items.is_empty());
        self.len -= gone;
        gone
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
    thinned: Counter,
    bytes: Gauge,
    /// The engine's eviction and thinning counts at the last `publish` (the counters take the
    /// difference).
    seen: (u64, u64),
}

impl KeptMetrics {
    pub fn register(m: &Metrics) -> KeptMetrics {
        let k = KeptMetrics {
            evicted: Counter::default(),
            thinned: Counter::default(),
            bytes: Gauge::default(),
            seen: (0, 0),
        };
        m.register(
            "tokenwatch_alerting_evicted_records",
            "Request records the alert engine dropped, oldest first, before their retention ran \
             out because their model kept a quarter more than its share of alerting.max_records \
             between two evaluations (a burst faster than thinning narrows)",
            k.evicted.clone(),
        );
        m.register(
            "tokenwatch_alerting_thinned_records",
            "Request records the alert engine dropped from its windows' older part because their \
             model kept more than its share of alerting.max_records: windows reaching back there \
             read a uniform sample of their span",
            k.thinned.clone(),
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

    /// Publish the engine's figures: its eviction and thinning counts since start (a count
    /// below the last one, after the kept state was rebuilt, counts from zero again), and
    /// `kept_bytes` now.
    pub fn publish(&mut self, (evicted_total, thinned_total): (u64, u64), kept_bytes: usize) {
        let new = |total: u64, seen: u64| total.checked_sub(seen).unwrap_or(total);
        self.evicted.inc_by(new(evicted_total, self.seen.0));
        self.thinned.inc_by(new(thinned_total, self.seen.1));
        self.seen = (evicted_total, thinned_total);
        self.bytes
            .set(i64::try_from(kept_bytes).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Timed for (i64, u32) {
        const SOURCE: u64 = 0;
        fn at_ms(&self) -> i64 {
            self.0
        }
        fn seq(&self) -> u64 {
            u64::from(self.1)
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
        k.publish((0, 0), 0);
        assert_eq!(read("tokenwatch_alerting_evicted_records_total"), Some(0.0));
        assert_eq!(read("tokenwatch_alerting_kept_bytes"), Some(0.0));
        k.publish((7, 0), 4096);
        k.publish((7, 100), 8192);
        k.publish((10, 150), 1024);
        assert_eq!(
            read("tokenwatch_alerting_evicted_records_total"),
            Some(10.0)
        );
        assert_eq!(read("tokenwatch_alerting_kept_bytes"), Some(1024.0));
        assert_eq!(
            read("tokenwatch_alerting_thinned_records_total"),
            Some(150.0)
        );
        // The engine's count started again (its kept state was rebuilt): counted on top.
        k.publish((2, 0), 0);
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

    #[test]
    fn thinning_keeps_a_uniform_sample_of_the_old_items_and_reads_on_by_sequence() {
        use crate::alerting::engine::thin::Schedule;
        let mut q = KeptQueue::default();
        let n = 20 * CHUNK;
        for i in 0..n {
            q.push_back((i as i64, i as u32));
        }
        let mut s = Schedule::default();
        let before = *s.cuts();
        // Over budget: the dense span narrows to 3/4 of half the age of the oldest item.
        s.step(n as i64, (n, n / 2), 0, 10 * n as i64);
        let mut seen = Vec::new();
        let gone = q.thin(&before, s.cuts(), |x| seen.push(x.1));
        assert_eq!(gone, seen.len());
        assert_eq!(q.len(), n - gone);
        assert!(gone > n / 4, "{gone} of {n}");
        // What went is what the cuts do not keep; what stayed, what they keep.
        let cuts = *s.cuts();
        let keeps = |x: &(i64, u32)| cuts.keeps(x.0, sample_id(x.1.into(), 0));
        assert!(q.iter().all(keeps));
        assert!(seen.iter().all(|&i| !keeps(&(i as i64, i))));
        // The dense part is whole; the memory follows what is kept.
        let dense = s.dense_ms().unwrap();
        let recent = q.iter().filter(|x| x.0 > n as i64 - dense).count();
        assert_eq!(recent, dense as usize - 1);
        assert!(q.capacity() <= 2 * q.len() + 21 * (16 + 1));
        // Read on by push sequence, thinned or not.
        for from in [0u64, 1, 777, (n - 1) as u64, n as u64] {
            let got: Vec<u32> = q.from_seq(from).map(|x| x.1).collect();
            let want: Vec<u32> = q
                .iter()
                .map(|x| x.1)
                .filter(|&i| u64::from(i) >= from)
                .collect();
            assert_eq!(got, want, "from {from}");
        }
        // The same cuts again thin nothing more.
        assert_eq!(q.thin(&cuts, &cuts, |_| {}), 0);
        assert_eq!(q.thin(&Cuts::default(), &cuts, |_| {}), 0);
    }
}
