// Bounded per-model inputs of the quality detectors: output embeddings sampled per time slot
// (a reservoir per slot, so a busy model keeps a reference) and prefix-cache access logs.

use rand::Rng;
use std::collections::VecDeque;
use std::sync::Arc;

/// Shortest sampling slot (slots grow when long retention × many dimensions would not fit).
pub const SLOT_MS: i64 = 5_000;
/// Floats kept per model across all slots (8 MiB of f32); with at most 1,000 models having
/// embeddings (`tokenwatch_core::embedding::MAX_EMBEDDING_MODELS`) this bounds the memory of the samples.
const FLOAT_BUDGET: usize = 2 << 20;
const MIN_PER_SLOT: usize = 4;
const MAX_PER_SLOT: usize = 1024;
/// Prefix-cache accesses kept per model.
pub const MAX_PREFIX_ACCESSES: usize = 100_000;

struct Slot {
    start: i64,
    seen: u64,
    items: Vec<(i64, Arc<[f32]>)>,
}

/// One model's embeddings: every slot keeps a uniform sample of at most `per_slot` of the
/// embeddings that arrived in it, so the reference window survives any request rate.
pub struct EmbeddingSamples {
    dim: usize,
    per_slot: usize,
    slot_ms: i64,
    slots: VecDeque<Slot>,
}

impl EmbeddingSamples {
    /// Sized so that `retention_ms` of full slots fit the float budget.
    pub fn new(dim: usize, retention_ms: i64) -> EmbeddingSamples {
        let (dim_i, retention) = (dim.max(1) as i64, retention_ms.max(SLOT_MS));
        let slot_ms =
            (retention * dim_i * MIN_PER_SLOT as i64 / FLOAT_BUDGET as i64 + 1).max(SLOT_MS);
        let slots = (retention / slot_ms + 2) as usize;
        let per_slot = (FLOAT_BUDGET / dim.max(1) / slots).clamp(MIN_PER_SLOT, MAX_PER_SLOT);
        EmbeddingSamples {
            dim,
            per_slot,
            slot_ms,
            slots: VecDeque::new(),
        }
    }

    /// Floats this model may hold at most.
    pub fn capacity_floats(&self, retention_ms: i64) -> usize {
        (retention_ms / self.slot_ms + 2) as usize * self.per_slot * self.dim
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn per_slot(&self) -> usize {
        self.per_slot
    }

    /// Adds one embedding; false (and nothing kept) when its dimension is not the model's.
    pub fn add(&mut self, at_ms: i64, v: Arc<[f32]>) -> bool {
        if v.len() != self.dim {
            return false;
        }
        let start = at_ms - at_ms.rem_euclid(self.slot_ms);
        let pos = match self.slots.binary_search_by_key(&start, |s| s.start) {
            Ok(p) => p,
            Err(p) => {
                self.slots.insert(
                    p,
                    Slot {
                        start,
                        seen: 0,
                        items: Vec::new(),
                    },
                );
                p
            }
        };
        let cap = self.per_slot;
        let slot = &mut self.slots[pos];
        slot.seen += 1;
        if slot.items.len() < cap {
            slot.items.push((at_ms, v));
        } else {
            let j = rand::rng().random_range(0..slot.seen);
            if let Ok(j) = usize::try_from(j)
                && j < cap
            {
                slot.items[j] = (at_ms, v);
            }
        }
        true
    }

    /// Drops slots that ended more than `keep_ms` before `now`; true when nothing is left.
    pub fn prune(&mut self, now: i64, keep_ms: i64) -> bool {
        while self
            .slots
            .front()
            .is_some_and(|s| s.start + self.slot_ms <= now - keep_ms)
        {
            self.slots.pop_front();
        }
        self.slots.is_empty()
    }

    /// Sampled embeddings with a time in `(from, to]`.
    pub fn window(&self, from: i64, to: i64) -> Vec<Vec<f32>> {
        self.in_window(from, to).map(|v| v.to_vec()).collect()
    }

    /// How many sampled embeddings have a time in `(from, to]`.
    pub fn count(&self, from: i64, to: i64) -> usize {
        self.in_window(from, to).count()
    }

    fn in_window(&self, from: i64, to: i64) -> impl Iterator<Item = &Arc<[f32]>> {
        let slot_ms = self.slot_ms;
        self.slots
            .iter()
            .filter(move |s| s.start + slot_ms > from && s.start <= to)
            .flat_map(|s| s.items.iter())
            .filter(move |(t, _)| *t > from && *t <= to)
            .map(|(_, v)| v)
    }
}

/// One access to a prefix-cache key.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixAccess {
    pub model: String,
    pub tenant: String,
    pub key: u64,
    pub at_ms: i64,
}

/// One model's recent prefix-cache accesses, oldest first, at most `MAX_PREFIX_ACCESSES`.
#[derive(Default)]
pub struct PrefixLog {
    accesses: VecDeque<(String, u64, i64)>,
    /// Bytes of the kept accesses' tenant names.
    tenant_bytes: usize,
}

impl PrefixLog {
    pub fn add(&mut self, tenant: String, key: u64, at_ms: i64) {
        if self.accesses.len() >= MAX_PREFIX_ACCESSES
            && let Some((t, _, _)) = self.accesses.pop_front()
        {
            self.tenant_bytes -= t.capacity();
        }
        self.tenant_bytes += tenant.capacity();
        self.accesses.push_back((tenant, key, at_ms));
    }

    /// Drops accesses older than `keep_ms`; true when nothing is left.
    pub fn prune(&mut self, now: i64, keep_ms: i64) -> bool {
        while self
            .accesses
            .front()
            .is_some_and(|(_, _, t)| now - t > keep_ms)
        {
            if let Some((t, _, _)) = self.accesses.pop_front() {
                self.tenant_bytes -= t.capacity();
            }
        }
        if self.accesses.capacity() > 2 * self.accesses.len() + 1024 {
            self.accesses.shrink_to_fit();
        }
        self.accesses.is_empty()
    }

    /// Bytes allocated for the accesses kept and their tenant names.
    pub fn bytes(&self) -> usize {
        self.accesses.capacity() * size_of::<(String, u64, i64)>() + self.tenant_bytes
    }

    /// Accesses in `(from, to]` as (tenant, key, time).
    pub fn window(&self, from: i64, to: i64) -> impl Iterator<Item = (&str, u64, i64)> {
        self.accesses
            .iter()
            .filter(move |(_, _, t)| *t > from && *t <= to)
            .map(|(tenant, k, t)| (tenant.as_str(), *k, *t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(x: f32, dim: usize) -> Arc<[f32]> {
        vec![x; dim].into()
    }

    #[test]
    fn slots_sample_keep_windows_and_prune() {
        let mut s = EmbeddingSamples::new(4, 60_000);
        assert!(s.per_slot() >= MIN_PER_SLOT);
        assert!(!s.add(0, v(1.0, 3)), "another dimension is refused");
        // Out of order arrivals land in their own slots.
        for t in [12_000, 1_000, 7_000, 2_000] {
            assert!(s.add(t, v(t as f32, 4)));
        }
        assert_eq!(s.count(0, 5_000), 2);
        assert_eq!(s.count(5_000, 20_000), 2);
        assert_eq!(s.window(6_999, 7_000)[0], vec![7_000.0; 4]);
        assert!(!s.prune(16_000, 10_000));
        assert_eq!(
            s.count(0, 20_000),
            2,
            "the first slot (0–5 s) ended over 10 s ago"
        );
        assert!(s.prune(100_000, 10_000));
    }

    #[test]
    fn a_busy_slot_keeps_a_bounded_uniform_sample() {
        // 4096 dims over an hour: longer slots with the minimum per slot, within the budget.
        let mut s = EmbeddingSamples::new(4096, 3_600_000);
        assert_eq!(s.per_slot(), MIN_PER_SLOT);
        assert!(s.capacity_floats(3_600_000) <= FLOAT_BUDGET + 2 * MIN_PER_SLOT * 4096);
        for (dim, retention) in [(384, 2_100_000), (8, 120_000), (1536, 3_600_000)] {
            let e = EmbeddingSamples::new(dim, retention);
            assert!(
                e.capacity_floats(retention) <= FLOAT_BUDGET + 2 * e.per_slot() * dim,
                "{dim} {retention}"
            );
        }
        let mut small = EmbeddingSamples::new(2, 60_000);
        let cap = small.per_slot();
        for i in 0..(cap * 10) {
            assert!(small.add(1_000, v(i as f32, 2)));
        }
        assert_eq!(small.count(0, 5_000), cap);
        // Later arrivals replaced some of the first ones (a reservoir, not the first `cap`).
        let later = small
            .window(0, 5_000)
            .iter()
            .filter(|x| x[0] >= cap as f32)
            .count();
        assert!(later > 0, "no later arrival was sampled");
        for i in 0..100 {
            s.add(i * 100, v(1.0, 4096));
        }
        assert_eq!(
            s.count(-1, 10_000),
            MIN_PER_SLOT,
            "one long slot keeps its share"
        );
    }

    #[test]
    fn prefix_log_is_bounded_and_windowed() {
        let mut l = PrefixLog::default();
        for i in 0..(MAX_PREFIX_ACCESSES as i64 + 10) {
            l.add("t".into(), i as u64, i);
        }
        assert_eq!(l.window(-1, i64::MAX).count(), MAX_PREFIX_ACCESSES);
        assert_eq!(l.window(-1, 9).count(), 0, "the oldest were dropped");
        assert_eq!(
            l.window(9, 12).map(|(_, k, _)| k).collect::<Vec<_>>(),
            vec![10, 11, 12]
        );
        // Their bytes: the accesses' room and their tenant names (one byte each).
        let per = size_of::<(String, u64, i64)>();
        assert_eq!(l.tenant_bytes, MAX_PREFIX_ACCESSES);
        assert!(l.bytes() >= MAX_PREFIX_ACCESSES * (per + 1));
        assert!(!l.prune(MAX_PREFIX_ACCESSES as i64 + 10, 5));
        assert_eq!(l.window(-1, i64::MAX).count(), 5);
        // The room a full log took is given back once it holds a few.
        assert_eq!(l.bytes(), l.accesses.capacity() * per + 5);
        assert!(l.accesses.capacity() < 1024);
        assert!(l.prune(i64::MAX / 2, 5));
        assert_eq!(l.tenant_bytes, 0);
    }
}
