// LatencySketch: the one mergeable quantile sketch of the project (DDSketch, one fixed config),
// its summary (count, mean, P50/P90/P95/P99) and its compact, panic-free binary encoding.

use serde::{Deserialize, Serialize};
use sketches_ddsketch::{Config, DDSketch};
use std::fmt;
use std::sync::LazyLock;

/// Relative accuracy of every sketch: each quantile in (0, 1) is within 1% of the exact value of
/// the same rank (`floor(q * (n - 1))` of the sorted input) for values in (`MIN_VALUE`,
/// `MAX_VALUE`]; q = 0 and q = 1 return the exact min and max.
pub const RELATIVE_ACCURACY: f64 = 0.01;
/// Bin limit of the DDSketch store (never reached: see `MAX_VALUE`).
pub const MAX_BINS: u32 = 2048;
/// Values at or below this (seconds) are counted in the zero bucket and reported as 0.
pub const MIN_VALUE: f64 = 1e-6;
/// Values above this (seconds, ~31 years) are rejected: with it, the keys of accepted values span
/// fewer than `MAX_BINS` bins, so the store never collapses and the accuracy bound always holds.
pub const MAX_VALUE: f64 = 1e9;

static CONFIG: LazyLock<Config> =
    LazyLock::new(|| Config::new(RELATIVE_ACCURACY, MAX_BINS, MIN_VALUE));
static KEY_RANGE: LazyLock<(i64, i64)> = LazyLock::new(|| {
    let c = config();
    (i64::from(c.key(MIN_VALUE)), i64::from(c.key(MAX_VALUE)))
});

fn config() -> Config {
    *CONFIG
}

/// Why bytes could not be decoded into a sketch.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SketchError {
    #[error("sketch bytes end early")]
    Truncated,
    #[error("invalid flag byte 0x{0:02x} in sketch bytes")]
    InvalidFlag(u8),
    #[error("sketch uses an index mapping other than tokenwatch's (gamma {0})")]
    IncompatibleMapping(f64),
    #[error("sketch bin index {0} is outside the accepted range")]
    BinOutOfRange(i64),
    #[error("invalid count in sketch bytes")]
    InvalidCount,
    #[error("invalid summary statistics in sketch bytes")]
    InvalidSummary,
    #[error("sketch bytes hold negative values, which tokenwatch never records")]
    NegativeValues,
}

/// A latency distribution in seconds: mergeable, with a relative-error bound (see
/// `RELATIVE_ACCURACY`). Count, sum, min and max are exact.
#[derive(Clone)]
pub struct LatencySketch {
    dd: DDSketch,
    // Exact statistics kept here rather than read from `dd`: a decoded sketch is rebuilt from
    // its bins, so `dd`'s own min/max/sum would only be approximations.
    min: f64,
    max: f64,
    sum: f64,
}

/// Count, mean and the standard quantiles of a sketch; `None` when the sketch is empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
}

impl Default for LatencySketch {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for LatencySketch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LatencySketch")
            .field("count", &self.count())
            .field("min", &self.quantile(0.0))
            .field("max", &self.quantile(1.0))
            .field("sum", &self.sum)
            .finish()
    }
}

impl LatencySketch {
    pub fn new() -> Self {
        LatencySketch {
            dd: DDSketch::new(config()),
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            sum: 0.0,
        }
    }

    /// Whether `add` would record `v`: finite, not negative, at most `MAX_VALUE`.
    pub fn accepts(v: f64) -> bool {
        (0.0..=MAX_VALUE).contains(&v)
    }

    /// Records one value (seconds). NaN, infinities, negatives and values above `MAX_VALUE` are
    /// skipped; returns whether the value was recorded.
    pub fn add(&mut self, v: f64) -> bool {
        if !Self::accepts(v) {
            return false;
        }
        let v = if v == 0.0 { 0.0 } else { v }; // -0.0 → 0.0
        self.dd.add(v);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.sum += v;
        true
    }

    /// Adds every value of `other` into `self`. Order-independent for count and quantiles.
    pub fn merge(&mut self, other: &LatencySketch) {
        if other.count() == 0 {
            return;
        }
        // Every sketch shares one config, so the merge cannot fail; stay consistent if it did.
        if self.dd.merge(&other.dd).is_ok() {
            self.min = self.min.min(other.min);
            self.max = self.max.max(other.max);
            self.sum += other.sum;
        }
    }

    pub fn count(&self) -> u64 {
        self.dd.count() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.count() == 0
    }

    /// Sum of the recorded values (0 when empty).
    pub fn sum(&self) -> f64 {
        self.sum
    }

    pub fn mean(&self) -> Option<f64> {
        let n = self.count();
        (n > 0).then(|| self.sum / n as f64)
    }

    /// The value of rank `floor(q * (n - 1))`, within `RELATIVE_ACCURACY` (exact for q = 0 and
    /// q = 1). `None` when empty or when q is not in [0, 1].
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if !(0.0..=1.0).contains(&q) || self.is_empty() {
            return None;
        }
        if q == 0.0 {
            return Some(self.min);
        }
        if q == 1.0 {
            return Some(self.max);
        }
        // Clamping to [min, max] only moves the estimate towards the exact value.
        let v = self.dd.quantile(q).ok().flatten()?;
        Some(v.max(self.min).min(self.max))
    }

    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            count: self.count(),
            mean: self.mean(),
            p50: self.quantile(0.5),
            p90: self.quantile(0.9),
            p95: self.quantile(0.95),
            p99: self.quantile(0.99),
        }
    }

    /// Approximate heap memory held (the dense bin array).
    pub fn heap_bytes(&self) -> usize {
        self.dd.length() * std::mem::size_of::<u64>()
    }

    /// Compact encoding: the DataDog DDSketch binary format (as written by
    /// `DDSketchWithExactSummaryStatistics`: count, min, max, sum, log index mapping, zero count,
    /// sparse positive bins). Typically 1–3 bytes per non-empty bin plus ~50 bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        // The bins are only reachable through the crate's own encoder; decode its output (always
        // well formed) to get them, then write the exact statistics kept here.
        // (The crate's output always parses; an empty fallback keeps this panic-free.)
        let parsed = parse(&self.dd.to_java_bytes()).unwrap_or_default();
        let mut out = Vec::with_capacity(64 + parsed.bins.len() * 3);
        let count = self.count();
        if count > 0 {
            out.push(FLAG_COUNT);
            enc::var_double(&mut out, count as f64);
            out.push(FLAG_MIN);
            out.extend_from_slice(&self.min.to_le_bytes());
            out.push(FLAG_MAX);
            out.extend_from_slice(&self.max.to_le_bytes());
        }
        if self.sum != 0.0 {
            out.push(FLAG_SUM);
            out.extend_from_slice(&self.sum.to_le_bytes());
        }
        out.push(FLAG_INDEX_MAPPING_LOG);
        out.extend_from_slice(&config().gamma.to_le_bytes());
        out.extend_from_slice(&0.0f64.to_le_bytes());
        if parsed.zero_count > 0 {
            out.push(FLAG_ZERO_COUNT);
            enc::var_double(&mut out, parsed.zero_count as f64);
        }
        if !parsed.bins.is_empty() {
            out.push((MODE_DELTAS_AND_COUNTS << 2) | TYPE_POSITIVE_STORE);
            enc::unsigned_var_long(&mut out, parsed.bins.len() as u64);
            let mut prev = 0i64;
            for &(key, n) in &parsed.bins {
                enc::signed_var_long(&mut out, key - prev);
                enc::var_double(&mut out, n as f64);
                prev = key;
            }
        }
        out
    }

    /// Decodes `to_bytes` output (or any DDSketch-format bytes with tokenwatch's mapping and
    /// bins in range). Never panics; the result merges with fresh sketches.
    pub fn from_bytes(bytes: &[u8]) -> Result<LatencySketch, SketchError> {
        let mut s = LatencySketch::new();
        s.merge_bytes(bytes)?;
        Ok(s)
    }

    /// `self.merge(&LatencySketch::from_bytes(bytes)?)` without building the intermediate
    /// sketch. On error `self` is unchanged.
    pub fn merge_bytes(&mut self, bytes: &[u8]) -> Result<(), SketchError> {
        let mut p = parse(bytes)?;
        let mut total = p.zero_count;
        for &(_, n) in &p.bins {
            total = total.checked_add(n).ok_or(SketchError::InvalidCount)?;
        }
        if total > MAX_EXACT_COUNT || p.count.is_some_and(|c| c != total as f64) {
            return Err(SketchError::InvalidCount);
        }
        if total == 0 {
            return Ok(());
        }
        let (min, max) = match (p.min, p.max) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(SketchError::InvalidSummary),
        };
        let sum = p.sum.unwrap_or(0.0);
        let valid = Self::accepts(min) && Self::accepts(max) && min <= max;
        // Bounding the sum by count × MAX_VALUE keeps every later merge finite.
        let sum_ok = sum.is_finite() && sum >= 0.0 && sum <= total as f64 * MAX_VALUE;
        if !valid || !sum_ok {
            return Err(SketchError::InvalidSummary);
        }
        let mut reps = Vec::with_capacity(p.bins.len());
        for (key, n) in p.bins.drain(..) {
            reps.push((
                representative(key).ok_or(SketchError::BinOutOfRange(key))?,
                n,
            ));
        }
        // Validated: from here on nothing fails.
        if p.zero_count > 0 {
            self.dd.add_with_count(0.0, p.zero_count);
        }
        for (v, n) in reps {
            self.dd.add_with_count(v, n);
        }
        self.min = self.min.min(if min == 0.0 { 0.0 } else { min });
        self.max = self.max.max(if max == 0.0 { 0.0 } else { max });
        self.sum += sum;
        Ok(())
    }
}

/// Counts above 2^53 cannot be carried exactly by the format's doubles.
const MAX_EXACT_COUNT: u64 = 1 << 53;

/// A value that lands in bin `key` and above `MIN_VALUE` (so not in the zero bucket); `None`
/// outside the accepted key range.
fn representative(key: i64) -> Option<f64> {
    let (lo, _) = *KEY_RANGE;
    let i = usize::try_from(key.checked_sub(lo)?).ok()?;
    REPRESENTATIVES.get(i).copied().flatten()
}

/// `representative` for every accepted key, computed once (decoding is on the query path).
static REPRESENTATIVES: LazyLock<Vec<Option<f64>>> = LazyLock::new(|| {
    let (lo, hi) = *KEY_RANGE;
    let cfg = config();
    (lo..=hi)
        .map(|key| {
            let k = i32::try_from(key).ok()?;
            let mut v = cfg.value(k);
            if v <= MIN_VALUE {
                v = MIN_VALUE * (1.0 + 1e-9);
            }
            (v > MIN_VALUE && cfg.key(v) == k).then_some(v)
        })
        .collect()
});

// ---- DataDog DDSketch binary format (subset), validated decoder ----

const TYPE_SKETCH_FEATURES: u8 = 0;
const TYPE_POSITIVE_STORE: u8 = 1;
const TYPE_INDEX_MAPPING: u8 = 2;
const TYPE_NEGATIVE_STORE: u8 = 3;
const FLAG_INDEX_MAPPING_LOG: u8 = TYPE_INDEX_MAPPING; // subflag 0: logarithmic mapping
const FLAG_ZERO_COUNT: u8 = (1 << 2) | TYPE_SKETCH_FEATURES;
const FLAG_COUNT: u8 = (0x28 << 2) | TYPE_SKETCH_FEATURES;
const FLAG_SUM: u8 = (0x21 << 2) | TYPE_SKETCH_FEATURES;
const FLAG_MIN: u8 = (0x22 << 2) | TYPE_SKETCH_FEATURES;
const FLAG_MAX: u8 = (0x23 << 2) | TYPE_SKETCH_FEATURES;
const MODE_DELTAS_AND_COUNTS: u8 = 1;
const MODE_DELTAS: u8 = 2;
const MODE_CONTIGUOUS: u8 = 3;

#[derive(Default)]
struct Parsed {
    count: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
    sum: Option<f64>,
    zero_count: u64,
    bins: Vec<(i64, u64)>,
}

fn parse(bytes: &[u8]) -> Result<Parsed, SketchError> {
    let mut input = bytes;
    let mut p = Parsed::default();
    let mut mapping_seen = false;
    let (lo, hi) = *KEY_RANGE;
    while let Some(flag) = dec::byte_opt(&mut input) {
        match flag & 0x03 {
            TYPE_INDEX_MAPPING => {
                if flag != FLAG_INDEX_MAPPING_LOG {
                    return Err(SketchError::InvalidFlag(flag));
                }
                let gamma = dec::f64_le(&mut input)?;
                let offset = dec::f64_le(&mut input)?;
                let expected = config().gamma;
                let same = (gamma - expected).abs() <= expected * 1e-12;
                if !same || offset != 0.0 {
                    return Err(SketchError::IncompatibleMapping(gamma));
                }
                mapping_seen = true;
            }
            TYPE_SKETCH_FEATURES => match flag {
                FLAG_ZERO_COUNT => {
                    let n = dec::count(&mut input)?;
                    p.zero_count = p
                        .zero_count
                        .checked_add(n)
                        .ok_or(SketchError::InvalidCount)?;
                }
                FLAG_COUNT => p.count = Some(dec::var_double(&mut input)?),
                FLAG_SUM => p.sum = Some(dec::f64_le(&mut input)?),
                FLAG_MIN => p.min = Some(dec::f64_le(&mut input)?),
                FLAG_MAX => p.max = Some(dec::f64_le(&mut input)?),
                _ => return Err(SketchError::InvalidFlag(flag)),
            },
            TYPE_POSITIVE_STORE | TYPE_NEGATIVE_STORE => {
                let negative = flag & 0x03 == TYPE_NEGATIVE_STORE;
                let mode = flag >> 2;
                let n = dec::unsigned_var_long(&mut input)?;
                let push = |p: &mut Parsed, key: i64, count: u64| -> Result<(), SketchError> {
                    if count == 0 {
                        return Ok(());
                    }
                    if negative {
                        return Err(SketchError::NegativeValues);
                    }
                    if key < lo || key > hi {
                        return Err(SketchError::BinOutOfRange(key));
                    }
                    p.bins.push((key, count));
                    Ok(())
                };
                // Every bin consumes at least one byte, so these loops end with the input.
                match mode {
                    MODE_DELTAS_AND_COUNTS | MODE_DELTAS => {
                        let mut key = 0i64;
                        for _ in 0..n {
                            let d = dec::signed_var_long(&mut input)?;
                            key = key.checked_add(d).ok_or(SketchError::BinOutOfRange(d))?;
                            let c = if mode == MODE_DELTAS {
                                1
                            } else {
                                dec::count(&mut input)?
                            };
                            push(&mut p, key, c)?;
                        }
                    }
                    MODE_CONTIGUOUS => {
                        let mut key = dec::signed_var_long(&mut input)?;
                        let step = dec::signed_var_long(&mut input)?;
                        for i in 0..n {
                            if i > 0 {
                                key = key
                                    .checked_add(step)
                                    .ok_or(SketchError::BinOutOfRange(key))?;
                            }
                            let c = dec::count(&mut input)?;
                            push(&mut p, key, c)?;
                        }
                    }
                    _ => return Err(SketchError::InvalidFlag(flag)),
                }
            }
            _ => return Err(SketchError::InvalidFlag(flag)),
        }
    }
    if !mapping_seen {
        return Err(SketchError::IncompatibleMapping(f64::NAN));
    }
    // Merge duplicate keys and sort, so re-encoding is canonical.
    p.bins.sort_unstable_by_key(|b| b.0);
    let mut merged: Vec<(i64, u64)> = Vec::with_capacity(p.bins.len());
    for (k, n) in p.bins.drain(..) {
        match merged.last_mut() {
            Some(last) if last.0 == k => {
                last.1 = last.1.checked_add(n).ok_or(SketchError::InvalidCount)?;
            }
            _ => merged.push((k, n)),
        }
    }
    p.bins = merged;
    Ok(p)
}

mod enc {
    const VAR_DOUBLE_ROTATE: u32 = 6;

    pub fn unsigned_var_long(out: &mut Vec<u8>, mut v: u64) {
        let len = ((63 - v.leading_zeros() as i32) / 7).clamp(0, 8);
        for _ in 0..len {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    pub fn signed_var_long(out: &mut Vec<u8>, v: i64) {
        unsigned_var_long(out, ((v >> 63) ^ (v << 1)) as u64);
    }

    pub fn var_double(out: &mut Vec<u8>, v: f64) {
        let mut bits = (v + 1.0)
            .to_bits()
            .wrapping_sub(1.0f64.to_bits())
            .rotate_left(VAR_DOUBLE_ROTATE);
        for _ in 0..8 {
            let next = (bits >> 57) as u8;
            bits <<= 7;
            if bits == 0 {
                out.push(next);
                return;
            }
            out.push(next | 0x80);
        }
        out.push((bits >> 56) as u8);
    }

    pub fn var_bits_to_double(bits: u64) -> f64 {
        f64::from_bits(
            bits.rotate_right(VAR_DOUBLE_ROTATE)
                .wrapping_add(1.0f64.to_bits()),
        ) - 1.0
    }
}

mod dec {
    use super::SketchError;

    pub fn byte_opt(input: &mut &[u8]) -> Option<u8> {
        let (&b, rest) = input.split_first()?;
        *input = rest;
        Some(b)
    }

    fn byte(input: &mut &[u8]) -> Result<u8, SketchError> {
        byte_opt(input).ok_or(SketchError::Truncated)
    }

    pub fn f64_le(input: &mut &[u8]) -> Result<f64, SketchError> {
        let (head, rest) = input
            .split_first_chunk::<8>()
            .ok_or(SketchError::Truncated)?;
        *input = rest;
        Ok(f64::from_le_bytes(*head))
    }

    pub fn unsigned_var_long(input: &mut &[u8]) -> Result<u64, SketchError> {
        let mut value = 0u64;
        let mut shift = 0u32;
        loop {
            let next = byte(input)?;
            if next < 0x80 || shift == 56 {
                return Ok(value | (u64::from(next) << shift));
            }
            value |= (u64::from(next) & 0x7f) << shift;
            shift += 7;
        }
    }

    pub fn signed_var_long(input: &mut &[u8]) -> Result<i64, SketchError> {
        let e = unsigned_var_long(input)?;
        Ok(((e >> 1) as i64) ^ -((e & 1) as i64))
    }

    pub fn var_double(input: &mut &[u8]) -> Result<f64, SketchError> {
        let mut bits = 0u64;
        let mut shift: i32 = 57;
        loop {
            let next = byte(input)?;
            if shift == 1 {
                bits |= u64::from(next);
                break;
            }
            if next < 0x80 {
                bits |= u64::from(next) << shift;
                break;
            }
            bits |= (u64::from(next) & 0x7f) << shift;
            shift -= 7;
        }
        Ok(super::enc::var_bits_to_double(bits))
    }

    /// A bin count: a whole, non-negative double no larger than 2^53.
    pub fn count(input: &mut &[u8]) -> Result<u64, SketchError> {
        let c = var_double(input)?;
        let ok =
            c.is_finite() && c >= 0.0 && c.fract() == 0.0 && c <= super::MAX_EXACT_COUNT as f64;
        if ok {
            Ok(c as u64)
        } else {
            Err(SketchError::InvalidCount)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const QS: [f64; 9] = [0.0, 0.01, 0.1, 0.25, 0.5, 0.9, 0.95, 0.99, 1.0];

    fn sketch_of(values: &[f64]) -> LatencySketch {
        let mut s = LatencySketch::new();
        for &v in values {
            s.add(v);
        }
        s
    }

    fn exact(sorted: &[f64], q: f64) -> f64 {
        sorted[(q * (sorted.len() as f64 - 1.0)) as usize]
    }

    fn assert_same(a: &LatencySketch, b: &LatencySketch) {
        assert_eq!(a.count(), b.count());
        for q in QS {
            assert_eq!(a.quantile(q), b.quantile(q), "q={q}");
        }
    }

    /// Latencies from 2 µs to 1e6 s, log-uniform.
    fn latency() -> impl Strategy<Value = f64> {
        (-5.7f64..6.0).prop_map(|e| 10f64.powf(e))
    }

    proptest! {
        #[test]
        fn quantiles_within_relative_accuracy(
            values in prop::collection::vec(latency(), 1..400),
            extra_q in prop::collection::vec(0.0f64..=1.0, 0..8),
        ) {
            let s = sketch_of(&values);
            let mut sorted = values.clone();
            sorted.sort_by(f64::total_cmp);
            for q in QS.iter().copied().chain(extra_q) {
                let want = exact(&sorted, q);
                let got = s.quantile(q).unwrap();
                prop_assert!((got - want).abs() <= RELATIVE_ACCURACY * want + 1e-9,
                    "q={} got={} want={}", q, got, want);
            }
            prop_assert_eq!(s.count(), values.len() as u64);
            let sum: f64 = values.iter().sum();
            prop_assert!((s.sum() - sum).abs() <= 1e-9 * sum.abs());
        }

        #[test]
        fn tiny_values_have_absolute_error_below_min_value(
            values in prop::collection::vec(prop_oneof![Just(0.0), 0.0f64..2e-6, latency()], 1..200),
        ) {
            let s = sketch_of(&values);
            let mut sorted = values.clone();
            sorted.sort_by(f64::total_cmp);
            for q in QS {
                let want = exact(&sorted, q);
                let got = s.quantile(q).unwrap();
                prop_assert!((got - want).abs() <= RELATIVE_ACCURACY * want + MIN_VALUE + 1e-12);
            }
        }

        #[test]
        fn merge_is_associative_and_commutative(
            a in prop::collection::vec(latency(), 0..100),
            b in prop::collection::vec(latency(), 0..100),
            c in prop::collection::vec(latency(), 0..100),
        ) {
            let (sa, sb, sc) = (sketch_of(&a), sketch_of(&b), sketch_of(&c));
            let mut left = sa.clone();
            left.merge(&sb);
            left.merge(&sc);
            let mut bc = sb.clone();
            bc.merge(&sc);
            let mut right = sa.clone();
            right.merge(&bc);
            let mut other = sc.clone();
            other.merge(&sa);
            other.merge(&sb);
            let mut all: Vec<f64> = a.iter().chain(&b).chain(&c).copied().collect();
            let direct = sketch_of(&all);
            all.clear();
            for s in [&right, &other, &direct] {
                assert_same(&left, s);
                prop_assert!((left.sum() - s.sum()).abs() <= 1e-9 * left.sum().abs());
            }
        }

        #[test]
        fn bytes_round_trip_exactly(values in prop::collection::vec(prop_oneof![Just(0.0), latency()], 0..300)) {
            let s = sketch_of(&values);
            let bytes = s.to_bytes();
            let d = LatencySketch::from_bytes(&bytes).unwrap();
            assert_same(&s, &d);
            prop_assert_eq!(s.sum().to_bits(), d.sum().to_bits());
            prop_assert_eq!(d.to_bytes(), bytes.clone(), "canonical");
            // Decoded sketches merge with fresh ones as the originals would.
            let fresh = sketch_of(&[0.25, 3.0, 1e-3]);
            let mut m1 = fresh.clone();
            m1.merge(&d);
            let mut m2 = fresh.clone();
            m2.merge(&s);
            assert_same(&m1, &m2);
            let mut m3 = d.clone();
            m3.merge(&fresh);
            assert_same(&m1, &m3);
            let mut m4 = fresh.clone();
            m4.merge_bytes(&bytes).unwrap();
            assert_same(&m1, &m4);
        }

        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(s) = LatencySketch::from_bytes(&bytes) {
                let _ = s.summary();
                let mut m = sketch_of(&[1.0]);
                m.merge(&s);
                let _ = m.summary();
                let _ = LatencySketch::from_bytes(&s.to_bytes()).unwrap();
            }
        }

        #[test]
        fn corrupted_encodings_never_panic(
            values in prop::collection::vec(latency(), 1..50),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut bytes = sketch_of(&values).to_bytes();
            for (i, b) in edits {
                let i = i.index(bytes.len());
                bytes[i] = b;
            }
            for candidate in [&bytes[..], &bytes[..cut.index(bytes.len() + 1)]] {
                let mut target = sketch_of(&values);
                if target.merge_bytes(candidate).is_err() {
                    assert_same(&target, &sketch_of(&values)); // unchanged on error
                }
                if let Ok(s) = LatencySketch::from_bytes(candidate) {
                    let mut m = sketch_of(&values);
                    m.merge(&s);
                    let _ = m.summary();
                    let _ = s.to_bytes();
                }
            }
        }
    }

    #[test]
    fn every_bin_key_has_a_representative() {
        let (lo, hi) = *KEY_RANGE;
        assert!(
            hi - lo + 1 < i64::from(MAX_BINS),
            "accepted range never collapses the store"
        );
        for k in lo..=hi {
            assert!(representative(k).is_some(), "key {k}");
        }
        assert!(representative(lo - 1).is_none() && representative(hi + 1).is_none());
    }

    #[test]
    fn rejects_invalid_values_and_handles_empty() {
        let mut s = LatencySketch::new();
        for v in [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -1.0,
            MAX_VALUE * 2.0,
        ] {
            assert!(!s.add(v));
        }
        assert!(s.is_empty());
        let sum = s.summary();
        assert_eq!(sum.count, 0);
        assert!(sum.mean.is_none() && sum.p50.is_none() && sum.p99.is_none());
        assert_eq!(s.quantile(0.5), None);
        assert!(s.add(-0.0) && s.add(MAX_VALUE));
        assert_eq!(s.quantile(0.0), Some(0.0));
        assert_eq!(s.quantile(1.0), Some(MAX_VALUE));
        assert_eq!(s.quantile(1.5), None);
        assert_eq!(s.quantile(f64::NAN), None);
        let empty = LatencySketch::from_bytes(&LatencySketch::new().to_bytes()).unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn summary_of_known_data() {
        let values: Vec<f64> = (1..=100).map(|i| i as f64 / 100.0).collect();
        let s = sketch_of(&values);
        let sum = s.summary();
        assert_eq!(sum.count, 100);
        assert!((sum.mean.unwrap() - 0.505).abs() < 1e-12);
        for (got, want) in [
            (sum.p50, 0.50),
            (sum.p90, 0.90),
            (sum.p95, 0.95),
            (sum.p99, 0.99),
        ] {
            assert!(
                (got.unwrap() - want).abs() <= want * RELATIVE_ACCURACY + 1e-9,
                "{got:?} vs {want}"
            );
        }
        let json = serde_json::to_value(&sum).unwrap();
        assert_eq!(json["count"], 100);
        assert!(s.heap_bytes() > 0);
    }

    #[test]
    fn decoder_rejects_foreign_or_inconsistent_bytes() {
        assert!(matches!(
            LatencySketch::from_bytes(&[]),
            Err(SketchError::IncompatibleMapping(_))
        ));
        let good = sketch_of(&[0.5, 1.5]).to_bytes();
        assert!(LatencySketch::from_bytes(&good[..good.len() - 1]).is_err());
        // Another relative accuracy means another mapping: refused rather than misread.
        let mut other = DDSketch::new(Config::new(0.02, 2048, 1e-9));
        other.add(1.0);
        assert!(matches!(
            LatencySketch::from_bytes(&other.to_java_bytes()),
            Err(SketchError::IncompatibleMapping(_))
        ));
        let mut neg = DDSketch::new(config());
        neg.add(-1.0);
        assert!(LatencySketch::from_bytes(&neg.to_java_bytes()).is_err());
    }
}
