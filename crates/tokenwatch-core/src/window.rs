// Sliding windows (1 min, 5 min, 1 h) over explicit unix-millisecond time: tiered rings of
// sketch slots (SlidingSketch), the generic ring they use, and the per-minute hand-out for roll-ups.

use crate::sketch::LatencySketch;
use serde::{Deserialize, Serialize};

/// A query window. Each is served by one tier of slots; see `Window::covered_range`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Window {
    #[serde(rename = "1m")]
    M1,
    #[serde(rename = "5m")]
    M5,
    #[serde(rename = "1h")]
    H1,
}

/// Slot length of the 10-second tier (serves `Window::M1`).
pub const TIER_10S_MS: i64 = 10_000;
/// Slot length of the 1-minute tier (serves `Window::M5` and the per-minute roll-ups).
pub const TIER_1M_MS: i64 = 60_000;
/// Slot length of the 5-minute tier (serves `Window::H1`).
pub const TIER_5M_MS: i64 = 300_000;
const N_10S: usize = 6;
const N_1M: usize = 5;
const N_5M: usize = 12;

impl Window {
    pub const ALL: [Window; 3] = [Window::M1, Window::M5, Window::H1];

    pub fn parse(s: &str) -> Option<Window> {
        Window::ALL.into_iter().find(|w| w.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            Window::M1 => "1m",
            Window::M5 => "5m",
            Window::H1 => "1h",
        }
    }

    /// Nominal length: 60 000, 300 000 or 3 600 000 ms.
    pub fn duration_ms(self) -> i64 {
        match self {
            Window::M1 => 60_000,
            Window::M5 => 300_000,
            Window::H1 => 3_600_000,
        }
    }

    /// Slot length of the tier serving this window: 10 s, 1 min or 5 min.
    pub fn slot_ms(self) -> i64 {
        match self {
            Window::M1 => TIER_10S_MS,
            Window::M5 => TIER_1M_MS,
            Window::H1 => TIER_5M_MS,
        }
    }

    /// Slots merged: the one containing `now` plus `slots() - 1` previous ones (6, 5, 12).
    pub fn slots(self) -> i64 {
        self.duration_ms() / self.slot_ms()
    }

    /// The timestamps `[start, end)` a window query at `now_unix_ms` covers: from the start of
    /// the slot `slots() - 1` slots before the one containing `now` to the end of the slot
    /// containing `now`. So the past covered, `now - start`, is between `duration - slot` and
    /// `duration` (50–60 s, 4–5 min, 55–60 min) and nothing older than `duration` is included.
    pub fn covered_range(self, now_unix_ms: i64) -> (i64, i64) {
        let s = self.slot_ms();
        let c = now_unix_ms.div_euclid(s);
        let start = c.saturating_sub(self.slots() - 1).saturating_mul(s);
        (start, c.saturating_add(1).saturating_mul(s))
    }

    /// Milliseconds of the past covered at `now` (`now - start`), the denominator for rates.
    pub fn covered_ms(self, now_unix_ms: i64) -> i64 {
        now_unix_ms.saturating_sub(self.covered_range(now_unix_ms).0)
    }

    fn slot_indices(self, now_unix_ms: i64) -> std::ops::RangeInclusive<i64> {
        let c = now_unix_ms.div_euclid(self.slot_ms());
        c.saturating_sub(self.slots() - 1)..=c
    }
}

/// A ring of `N` slots indexed by slot number (`time.div_euclid(slot_ms)`). It holds slots
/// `(head - N, head]`, where `head` is the newest slot number seen; advancing the head clears the
/// positions it reuses, so a `Some` slot always holds data of the slot number its position maps
/// to. Slots older than the span are refused.
#[derive(Debug, Clone)]
pub(crate) struct Ring<T, const N: usize> {
    head: Option<i64>,
    slots: [Option<T>; N],
}

impl<T, const N: usize> Ring<T, N> {
    pub(crate) fn new() -> Self {
        Ring {
            head: None,
            slots: std::array::from_fn(|_| None),
        }
    }

    fn pos(idx: i64) -> usize {
        // N is a small constant; rem_euclid is in [0, N).
        idx.rem_euclid(N as i64) as usize
    }

    fn holds(&self, idx: i64) -> bool {
        match self.head {
            Some(h) => idx <= h && idx > h.saturating_sub(N as i64),
            None => false,
        }
    }

    /// The slot for slot number `idx`, advancing the ring when `idx` is newer than the head.
    /// `None` when `idx` is older than the ring's span (the observation is dropped here).
    pub(crate) fn slot_mut(&mut self, idx: i64) -> Option<&mut Option<T>> {
        match self.head {
            None => self.head = Some(idx),
            Some(h) if idx > h => {
                let steps = idx.saturating_sub(h).min(N as i64);
                for j in 1..=steps {
                    let p = Self::pos(h.saturating_add(j));
                    if let Some(slot) = self.slots.get_mut(p) {
                        *slot = None;
                    }
                }
                self.head = Some(idx);
            }
            Some(_) => {
                if !self.holds(idx) {
                    return None;
                }
            }
        }
        self.slots.get_mut(Self::pos(idx))
    }

    pub(crate) fn get(&self, idx: i64) -> Option<&T> {
        if !self.holds(idx) {
            return None;
        }
        self.slots.get(Self::pos(idx))?.as_ref()
    }

    pub(crate) fn head(&self) -> Option<i64> {
        self.head
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().flatten()
    }

    /// Every held slot with a slot number below `idx`.
    pub(crate) fn older_than_mut(&mut self, idx: i64) -> impl Iterator<Item = &mut T> {
        let head = self.head;
        self.slots.iter_mut().enumerate().filter_map(move |(p, s)| {
            let h = head?;
            // Slot number held at position p: the one in (h - N, h] congruent to p.
            let back = (Self::pos(h) as i64 - p as i64).rem_euclid(N as i64);
            (h.saturating_sub(back) < idx)
                .then_some(s.as_mut())
                .flatten()
        })
    }
}

/// A slot's sketch: the head slot (and any slot that took a late value) is kept as a live
/// sketch; older slots are frozen into their compact encoding (`LatencySketch::to_bytes`,
/// typically a few hundred bytes instead of kilobytes of dense bins).
#[derive(Debug, Clone)]
enum Slot {
    Hot(Box<LatencySketch>),
    Frozen(Box<[u8]>),
}

impl Slot {
    fn add(&mut self, v: f64) {
        if let Slot::Frozen(b) = self {
            // Our own encoding always decodes; an empty sketch keeps this panic-free.
            *self = Slot::Hot(Box::new(LatencySketch::from_bytes(b).unwrap_or_default()));
        }
        if let Slot::Hot(s) = self {
            s.add(v);
        }
    }

    fn merge_into(&self, out: &mut LatencySketch) {
        match self {
            Slot::Hot(s) => out.merge(s),
            Slot::Frozen(b) => {
                let _ = out.merge_bytes(b);
            }
        }
    }

    fn to_sketch(&self) -> LatencySketch {
        match self {
            Slot::Hot(s) => (**s).clone(),
            Slot::Frozen(b) => LatencySketch::from_bytes(b).unwrap_or_default(),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Slot::Hot(s) => s.is_empty(),
            Slot::Frozen(_) => false, // only non-empty sketches are frozen
        }
    }

    fn freeze(&mut self) {
        if let Slot::Hot(s) = self
            && !s.is_empty()
        {
            *self = Slot::Frozen(s.to_bytes().into_boxed_slice());
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Slot::Hot(s) => std::mem::size_of::<LatencySketch>() + s.heap_bytes(),
            Slot::Frozen(b) => b.len(),
        }
    }
}

/// What `SlidingSketch::add` did with a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddOutcome {
    /// Not a valid latency (NaN, infinite, negative, above `sketch::MAX_VALUE`): skipped.
    Rejected,
    /// Recorded in every tier whose span still holds its time, and in a minute not yet handed
    /// out for roll-ups.
    Recorded,
    /// Recorded where possible, but its minute was already handed out by
    /// `take_completed_minutes` or has left the 1-minute ring: it is missing from the roll-ups.
    MissedRollup,
}

/// Latency over sliding 1 m / 5 m / 1 h windows, driven by explicit time (unix ms).
///
/// Three tiers of slots: 6 × 10 s, 5 × 1 min, 12 × 5 min. Each value is added to the slot
/// containing its timestamp in every tier whose span still holds that slot (a tier's span is the
/// newest slot seen and the N − 1 before it); older out-of-order values are dropped from that tier
/// only. Slot sketches are allocated on first use and freed when the ring moves past them; when
/// a tier moves to a new slot, the older slots are frozen into their compact encoding (exact:
/// windows over frozen slots give the same quantiles), and `compact` freezes the rest.
#[derive(Debug, Clone)]
pub struct SlidingSketch {
    s10: Ring<Slot, N_10S>,
    m1: Ring<Slot, N_1M>,
    m5: Ring<Slot, N_5M>,
    /// Every minute with index ≤ this has been handed out by `take_completed_minutes`.
    handed_out_through: i64,
    last_seen_ms: Option<i64>,
}

impl Default for SlidingSketch {
    fn default() -> Self {
        Self::new()
    }
}

/// Adds `v` to slot `idx`; when that moves the ring forward, freezes the slots behind the new
/// head. Returns whether the ring still held `idx`.
fn add_to<const N: usize>(ring: &mut Ring<Slot, N>, idx: i64, v: f64) -> bool {
    let advanced = ring.head().is_none_or(|h| idx > h);
    match ring.slot_mut(idx) {
        Some(slot) => slot.get_or_insert_with(|| Slot::Hot(Box::default())).add(v),
        None => return false,
    }
    if advanced {
        ring.older_than_mut(idx).for_each(Slot::freeze);
    }
    true
}

impl SlidingSketch {
    pub fn new() -> Self {
        SlidingSketch {
            s10: Ring::new(),
            m1: Ring::new(),
            m5: Ring::new(),
            handed_out_through: i64::MIN,
            last_seen_ms: None,
        }
    }

    /// Records `value` (seconds) observed at `now_unix_ms`.
    pub fn add(&mut self, now_unix_ms: i64, value: f64) -> AddOutcome {
        if !LatencySketch::accepts(value) {
            return AddOutcome::Rejected;
        }
        let t = now_unix_ms;
        add_to(&mut self.s10, t.div_euclid(TIER_10S_MS), value);
        let minute = t.div_euclid(TIER_1M_MS);
        let in_minute_tier = add_to(&mut self.m1, minute, value);
        add_to(&mut self.m5, t.div_euclid(TIER_5M_MS), value);
        self.last_seen_ms = Some(self.last_seen_ms.map_or(t, |l| l.max(t)));
        if in_minute_tier && minute > self.handed_out_through {
            AddOutcome::Recorded
        } else {
            AddOutcome::MissedRollup
        }
    }

    /// The values of `Window::covered_range(now_unix_ms)` merged into one sketch.
    pub fn window(&self, now_unix_ms: i64, w: Window) -> LatencySketch {
        let mut out = LatencySketch::new();
        self.window_into(now_unix_ms, w, &mut out);
        out
    }

    /// Like `window`, merging into `out` (saves an allocation when combining series).
    pub fn window_into(&self, now_unix_ms: i64, w: Window, out: &mut LatencySketch) {
        for idx in w.slot_indices(now_unix_ms) {
            let slot = match w {
                Window::M1 => self.s10.get(idx),
                Window::M5 => self.m1.get(idx),
                Window::H1 => self.m5.get(idx),
            };
            if let Some(s) = slot {
                s.merge_into(out);
            }
        }
    }

    /// Every non-empty 1-minute slot that is complete at `now_unix_ms` (minute end ≤ now) and was
    /// not handed out before, as `(minute start unix ms, sketch)`, oldest first. A minute is
    /// handed out at most once: values arriving later for it (`AddOutcome::MissedRollup`) stay in
    /// the windows but never reach a roll-up. The 1-minute ring keeps 5 minutes, so call this at
    /// least every ~4 minutes or older minutes are lost.
    pub fn take_completed_minutes(&mut self, now_unix_ms: i64) -> Vec<(i64, LatencySketch)> {
        let last_complete = now_unix_ms.div_euclid(TIER_1M_MS).saturating_sub(1);
        let mut out = Vec::new();
        if last_complete <= self.handed_out_through {
            return out;
        }
        if let Some(head) = self.m1.head() {
            let from = self
                .handed_out_through
                .saturating_add(1)
                .max(head.saturating_sub(N_1M as i64 - 1));
            let to = last_complete.min(head);
            for idx in from..=to {
                if let Some(s) = self.m1.get(idx).filter(|s| !s.is_empty()) {
                    out.push((idx.saturating_mul(TIER_1M_MS), s.to_sketch()));
                }
            }
        }
        self.handed_out_through = last_complete;
        out
    }

    /// True when nothing was observed, or the newest observation is more than `idle_ms` before
    /// `now_unix_ms`.
    pub fn is_idle(&self, now_unix_ms: i64, idle_ms: i64) -> bool {
        match self.last_seen_ms {
            None => true,
            Some(l) => now_unix_ms.saturating_sub(l) > idle_ms,
        }
    }

    /// Newest observation time (unix ms), if any.
    pub fn last_seen_ms(&self) -> Option<i64> {
        self.last_seen_ms
    }

    /// Approximate heap memory held by the slot sketches.
    pub fn heap_bytes(&self) -> usize {
        let (a, b, c) = (self.s10.iter(), self.m1.iter(), self.m5.iter());
        a.chain(b).chain(c).map(Slot::heap_bytes).sum()
    }

    /// Freezes every slot older than the one containing `now_unix_ms` in each tier (a series
    /// that went quiet otherwise keeps its last slots live). Cheap to call periodically.
    pub fn compact(&mut self, now_unix_ms: i64) {
        let t = now_unix_ms;
        self.s10
            .older_than_mut(t.div_euclid(TIER_10S_MS))
            .for_each(Slot::freeze);
        self.m1
            .older_than_mut(t.div_euclid(TIER_1M_MS))
            .for_each(Slot::freeze);
        self.m5
            .older_than_mut(t.div_euclid(TIER_5M_MS))
            .for_each(Slot::freeze);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: i64 = 1000;
    const MIN: i64 = 60 * S;
    /// An arbitrary, unaligned base time.
    const T0: i64 = 1_700_000_123_456;

    fn counts(s: &SlidingSketch, now: i64) -> [u64; 3] {
        Window::ALL.map(|w| s.window(now, w).count())
    }

    #[test]
    fn window_names_parse() {
        for w in Window::ALL {
            assert_eq!(Window::parse(w.name()), Some(w));
            assert_eq!(w.slots() * w.slot_ms(), w.duration_ms());
        }
        assert_eq!(Window::parse("2m"), None);
        assert_eq!(serde_json::to_string(&Window::H1).unwrap(), "\"1h\"");
    }

    #[test]
    fn sixty_one_seconds_old_is_out_of_1m_but_in_5m_and_1h() {
        for offset in (0..10_000).step_by(250) {
            let mut s = SlidingSketch::new();
            let t = T0 + offset;
            s.add(t, 0.5);
            assert_eq!(counts(&s, t + 61 * S), [0, 1, 1], "offset {offset}");
            assert_eq!(
                counts(&s, t + 50 * S),
                [1, 1, 1],
                "≤ 50 s old is always in 1m"
            );
            assert_eq!(
                counts(&s, t + 60 * S + 1)[0],
                0,
                "> 60 s old is never in 1m"
            );
            assert_eq!(counts(&s, t + 4 * MIN)[1], 1, "≤ 4 min old is always in 5m");
            assert_eq!(counts(&s, t + 5 * MIN + 1)[1], 0);
            assert_eq!(counts(&s, t + 55 * MIN)[2], 1);
            assert_eq!(counts(&s, t + 60 * MIN + 1)[2], 0);
        }
    }

    #[test]
    fn covered_range_is_slot_aligned() {
        let now = 10 * MIN + 15 * S; // 10:15 into the hour
        assert_eq!(
            Window::M1.covered_range(now),
            (10 * MIN - 40 * S, 10 * MIN + 20 * S)
        );
        assert_eq!(Window::M1.covered_ms(now), 55 * S);
        assert_eq!(Window::M5.covered_range(now), (6 * MIN, 11 * MIN));
        assert_eq!(Window::H1.covered_range(now), (-45 * MIN, 15 * MIN));
        let mut s = SlidingSketch::new();
        s.add(10 * MIN - 40 * S, 1.0); // first covered ms of 1m
        s.add(10 * MIN - 40 * S - 1, 1.0); // just before
        assert_eq!(s.window(now, Window::M1).count(), 1);
    }

    #[test]
    fn out_of_order_values_drop_from_short_tiers_only() {
        let mut s = SlidingSketch::new();
        s.add(T0, 1.0);
        assert_eq!(s.add(T0 - 2 * MIN, 2.0), AddOutcome::Recorded);
        assert_eq!(counts(&s, T0), [1, 2, 2]);
        // Older than the 1-minute ring's 5 slots: only the hour tier keeps it.
        assert_eq!(s.add(T0 - 10 * MIN, 3.0), AddOutcome::MissedRollup);
        assert_eq!(counts(&s, T0), [1, 2, 3]);
        assert_eq!(s.add(T0 - 2 * 3600 * S, 4.0), AddOutcome::MissedRollup);
        assert_eq!(counts(&s, T0), [1, 2, 3]);
        assert_eq!(s.add(T0, f64::NAN), AddOutcome::Rejected);
    }

    #[test]
    fn slots_are_reused_after_a_long_gap() {
        let mut s = SlidingSketch::new();
        for i in 0..100 {
            s.add(T0 + i * S, 0.1);
        }
        let later = T0 + 3 * 3600 * S;
        s.add(later, 0.2);
        assert_eq!(counts(&s, later), [1, 1, 1]);
        assert_eq!(s.window(later, Window::H1).quantile(0.5), Some(0.2));
        // Only the three current slots are still allocated.
        assert_eq!(
            s.s10.iter().count() + s.m1.iter().count() + s.m5.iter().count(),
            3
        );
        // Querying a time before the head sees only what the rings still hold.
        assert_eq!(counts(&s, T0), [0, 0, 0]);
    }

    #[test]
    fn older_slots_are_frozen_and_stay_exact() {
        let mut s = SlidingSketch::new();
        let mut direct = LatencySketch::new();
        for i in 0..600 {
            let v = 0.001 * (1 + i % 97) as f64;
            s.add(T0 + i * 100, v);
            direct.add(v);
        }
        let now = T0 + 59 * S;
        let hot = s.heap_bytes();
        s.compact(now + MIN);
        assert!(s.heap_bytes() < hot, "{} !< {hot}", s.heap_bytes());
        let got = s.window(now, Window::M5);
        for q in [0.0, 0.25, 0.5, 0.99, 1.0] {
            assert_eq!(got.quantile(q), direct.quantile(q));
        }
        // A late value thaws its slot.
        assert_eq!(s.add(T0, 0.5), AddOutcome::Recorded);
        assert_eq!(s.window(now, Window::M5).count(), 601);
    }

    #[test]
    fn completed_minutes_are_handed_out_once() {
        let base = 1000 * MIN; // minute-aligned
        let mut s = SlidingSketch::new();
        s.add(base + 5 * S, 1.0);
        s.add(base + 59 * S, 2.0);
        s.add(base + MIN, 3.0);
        assert!(
            s.take_completed_minutes(base + MIN - 1).is_empty(),
            "minute not complete"
        );
        let got = s.take_completed_minutes(base + MIN);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, base);
        assert_eq!(got[0].1.count(), 2);
        assert!(s.take_completed_minutes(base + MIN + 30 * S).is_empty());
        // A late value for the handed-out minute is kept for windows but not re-emitted.
        assert_eq!(s.add(base + 30 * S, 9.0), AddOutcome::MissedRollup);
        assert_eq!(s.window(base + MIN + 1, Window::M5).count(), 4);
        s.add(base + 3 * MIN + 1, 4.0);
        let got = s.take_completed_minutes(base + 10 * MIN);
        let starts: Vec<i64> = got.iter().map(|(m, _)| *m).collect();
        assert_eq!(
            starts,
            [base + MIN, base + 3 * MIN],
            "empty minutes are skipped, oldest first"
        );
        assert!(s.take_completed_minutes(base + 10 * MIN).is_empty());
        assert!(
            s.take_completed_minutes(base).is_empty(),
            "time going back hands out nothing"
        );
    }

    #[test]
    fn idle_and_extreme_times_do_not_panic() {
        let mut s = SlidingSketch::new();
        assert!(s.is_idle(0, 1000));
        for t in [i64::MIN, i64::MAX, 0, -1, i64::MIN + 1, i64::MAX - 1] {
            s.add(t, 1.0);
            for w in Window::ALL {
                let _ = s.window(t, w);
                let _ = w.covered_range(t);
                let _ = w.covered_ms(t);
            }
            let _ = s.take_completed_minutes(t);
            let _ = s.is_idle(t, i64::MAX);
            let _ = s.is_idle(i64::MIN, 0);
        }
        let mut s = SlidingSketch::new();
        s.add(T0, 1.0);
        assert!(!s.is_idle(T0 + 1000, 1000));
        assert!(s.is_idle(T0 + 1001, 1000));
        assert!(s.heap_bytes() > 0);
    }

    proptest! {
        /// With non-decreasing times, every window holds exactly the values whose timestamp is
        /// in its covered range.
        #[test]
        fn windows_match_brute_force(
            steps in prop::collection::vec((0i64..90_000, 0.001f64..10.0), 1..200),
            query_after in 0i64..4_000_000,
            compact in any::<bool>(),
        ) {
            let mut s = SlidingSketch::new();
            let mut t = T0;
            let mut seen = Vec::new();
            for (dt, v) in steps {
                t += dt;
                s.add(t, v);
                seen.push((t, v));
            }
            let now = t + query_after;
            if compact {
                s.compact(now);
            }
            for w in Window::ALL {
                let (a, b) = w.covered_range(now);
                let mut want = LatencySketch::new();
                for &(x, v) in &seen {
                    if x >= a && x < b {
                        want.add(v);
                    }
                }
                let got = s.window(now, w);
                prop_assert_eq!(got.count(), want.count(), "{:?}", w);
                for q in [0.0, 0.1, 0.5, 0.9, 0.99, 1.0] {
                    prop_assert_eq!(got.quantile(q), want.quantile(q));
                }
            }
        }

        /// Drained often enough, the minutes handed out account for every value exactly once.
        #[test]
        fn rollups_account_for_every_value(steps in prop::collection::vec(0i64..30_000, 1..300)) {
            let mut s = SlidingSketch::new();
            let mut t = T0;
            let mut total = 0u64;
            let mut starts = Vec::new();
            let n = steps.len() as u64;
            for dt in steps {
                t += dt;
                prop_assert_eq!(s.add(t, 0.1), AddOutcome::Recorded);
                for (m, sk) in s.take_completed_minutes(t) {
                    total += sk.count();
                    starts.push(m);
                }
            }
            for (m, sk) in s.take_completed_minutes(t + MIN) {
                total += sk.count();
                starts.push(m);
            }
            let mut dedup = starts.clone();
            dedup.dedup();
            prop_assert_eq!(dedup, starts);
            prop_assert_eq!(total, n);
        }
    }
}
