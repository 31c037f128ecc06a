// KV-cache block accounting (used, leaked, free) and a small prefix-cache index
// of prompt block hashes that turns repeated prompt prefixes into cache hits.

use std::collections::HashSet;

/// Fixed-capacity pool of KV blocks.
#[derive(Debug)]
pub struct KvCache {
    total: u32,
    used: u32,
    leaked: u32,
    prefix: HashSet<u64>,
}

impl KvCache {
    pub fn new(total: u32) -> KvCache {
        KvCache {
            total,
            used: 0,
            leaked: 0,
            prefix: HashSet::new(),
        }
    }

    pub fn total(&self) -> u32 {
        self.total
    }

    pub fn used(&self) -> u32 {
        self.used
    }

    pub fn leaked(&self) -> u32 {
        self.leaked
    }

    pub fn free(&self) -> u32 {
        self.total.saturating_sub(self.used + self.leaked)
    }

    /// Take `n` blocks if that many are free.
    pub fn try_alloc(&mut self, n: u32) -> bool {
        if self.free() < n {
            return false;
        }
        self.used += n;
        true
    }

    pub fn release(&mut self, n: u32) {
        self.used = self.used.saturating_sub(n);
    }

    /// Lose up to `n` free blocks for good; returns how many leaked.
    pub fn leak(&mut self, n: u32) -> u32 {
        let n = n.min(self.free());
        self.leaked += n;
        n
    }

    /// Give leaked blocks back (the fault was switched off: like a restart).
    pub fn reclaim_leaked(&mut self) {
        self.leaked = 0;
    }

    /// Give back just enough leaked blocks that `n` blocks are free (liveness valve).
    pub fn unleak_until_free(&mut self, n: u32) {
        let missing = n.saturating_sub(self.free());
        self.leaked -= missing.min(self.leaked);
    }

    /// Leading prompt blocks already in the prefix cache; remembers the rest.
    pub fn match_prefix(&mut self, block_hashes: &[u64]) -> u32 {
        let hits = block_hashes
            .iter()
            .take_while(|h| self.prefix.contains(h))
            .count();
        if self.prefix.len() + block_hashes.len() > self.total as usize * 4 {
            self.prefix.clear(); // crude eviction keeps the index bounded
        }
        self.prefix.extend(block_hashes.iter().copied());
        hits as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_leak_reclaim() {
        let mut kv = KvCache::new(10);
        assert!(kv.try_alloc(6));
        assert!(!kv.try_alloc(5));
        assert_eq!(kv.leak(8), 4);
        assert_eq!((kv.used(), kv.leaked(), kv.free()), (6, 4, 0));
        kv.release(6);
        kv.reclaim_leaked();
        assert_eq!(kv.free(), 10);
    }

    #[test]
    fn prefix_hits_are_leading_blocks() {
        let mut kv = KvCache::new(100);
        assert_eq!(kv.match_prefix(&[1, 2, 3]), 0);
        assert_eq!(kv.match_prefix(&[1, 2, 9]), 2);
        assert_eq!(kv.match_prefix(&[7, 1]), 0);
    }
}
