// Incremental sorted windows of the latency rules and the A/B arms, and the records and failures
// `error_burst` counts: each model's samples mirrored from the kept records by push sequence, per
// instance or arm in time order, thinned as the kept records are; windows slide on them.

use super::inputs::{Inputs, KeptSeq};
use super::record::{Label, LatencySample, Rec};
use super::thin::{Cuts, read_at};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Which window of a series: windows of different slots are kept apart (each moves wherever it
/// is asked to next, by difference when the move is small, rebuilt otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    /// A rule's current window, by its length.
    Current(i64),
    /// The spike's short window.
    Short(i64),
    /// An instance's stretched window (1..=3 windows, `latency::MAX_STRETCH_WINDOWS`).
    Scaled(i64),
    /// A reference period, by its length.
    Baseline(i64),
}

/// A mirrored sample: (at_ms, id, value); id = push sequence << 1 | source (0 record, 1 early
/// first token), so that (at_ms, id) orders samples and names each one. A NaN value (never a
/// record's: `Rec::value` keeps finite values only) marks a record counted without a value
/// (an arm's failed requests, see `By::Arm`; every sample of `By::Records` and `By::Failures`):
/// in `counts`, in no window.
type Point = (i64, u64, f64);

/// A mirrored sample in push order: (push sequence, at_ms, its line).
type Order = (u64, i64, Label);

/// Bytes a mirrored sample takes: its point in its line and its place in the push order (each
/// window holding it adds its value, 8 bytes).
pub const SAMPLE_BYTES: usize = size_of::<Point>() + size_of::<Order>();

/// What a mirror's lines are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum By {
    /// Each instance's successful samples with a value (the latency rules).
    Instance,
    /// Each A/B arm's records (those with an A/B group), every one counted and the successful
    /// ones' values in the windows (`ab_regression`).
    Arm,
    /// Each instance's records (the empty instance too), counted without values (`error_burst`).
    Records,
    /// Each instance's records that count as server failures, as `Records`.
    Failures,
}

/// A change to a window's samples since it was last read: (at_ms, value, added).
type Change = (i64, f64, bool);

/// Fewest changes worth merging in one pass rather than inserting one by one.
const MERGE_FROM: usize = 24;

/// A window (from, to] of one scope (an instance, or all of them): its values sorted.
struct Window {
    from: i64,
    to: i64,
    vals: Vec<f64>,
    /// Samples added to and removed from the mirror since the window was read.
    log: Vec<Change>,
    /// The log overflowed (or a removal did not match): rebuild on the next read.
    stale: bool,
    /// Its samples' thinning level (`super::thin`): only samples of this level or above are in.
    level: u8,
    used: i64,
    /// Times the window was read from scratch.
    rebuilds: u64,
}

/// One model's samples of one value as one rule signal sees them (`Inputs::latency_window`),
/// successful requests only, per instance (or its records per A/B arm, see `By`), and the
/// windows read on them.
struct Mirror {
    by: By,
    epoch: u64,
    /// Next push sequence to read, per source.
    next: [u64; 2],
    /// Samples known at or before this are not kept (no window reaches that far back).
    horizon: i64,
    /// The reach before `now` each caller asked for, and when it last did.
    spans: Vec<(i64, i64)>,
    /// The samples kept, per source in push order (to drop those the kept queue evicts).
    order: [VecDeque<Order>; 2],
    lines: BTreeMap<Label, VecDeque<Point>>,
    windows: HashMap<(Option<Label>, Slot), Window>,
    used: i64,
    /// The model's thinning as of the last sync: what the windows read at.
    cuts: Cuts,
    /// The thinning the samples were last dropped by, and when.
    thinned: (Cuts, i64),
}

/// Shortest time between two passes dropping the samples the kept records' thinning dropped
/// (until then the windows skip them by their level).
const THIN_EVERY_MS: i64 = 1_000;

/// Forget windows and mirrors not read for this long (beyond their own reach).
const IDLE_MS: i64 = 60_000;

/// The mirrors of every (model, signal, value) a latency rule reads and of every (model, value)
/// `ab_regression` reads by arm; shared by the rules.
#[derive(Default)]
pub struct LatencyWindows {
    mirrors: HashMap<Key, Mirror>,
    last_gc: i64,
}

/// The windows one engine's rules share across its evaluations: the latency rules,
/// `ks_drift` and `ab_regression` read them through `EvalCtx::latency_windows`.
#[derive(Default)]
pub struct SharedWindows(std::sync::Mutex<LatencyWindows>);

impl SharedWindows {
    /// The windows (a poisoned lock, after a panic while they were changed, starts them afresh).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, LatencyWindows> {
        self.0.lock().unwrap_or_else(|poisoned| {
            self.0.clear_poison();
            let mut g = poisoned.into_inner();
            *g = Default::default();
            g
        })
    }
}

/// The places in `pts` of the samples in `(from, to]` (empty when `to <= from`).
fn between(pts: &VecDeque<Point>, from: i64, to: i64) -> std::ops::Range<usize> {
    let lower = |at: i64| pts.partition_point(|p| p.0 <= at);
    let (a, b) = (lower(from), lower(to));
    a..b.max(a)
}

/// The values of the samples in `(from, to]` read at `lvl`.
fn range(pts: &VecDeque<Point>, from: i64, to: i64, lvl: u8) -> impl Iterator<Item = f64> + '_ {
    pts.range(between(pts, from, to))
        .filter(move |p| read_at(p.1, lvl))
        .map(|p| p.2)
        .filter(|v| !v.is_nan())
}

/// How many samples of `pts` are in `(from, to]` at `lvl` (by binary search when unthinned).
fn count(pts: &VecDeque<Point>, from: i64, to: i64, lvl: u8) -> usize {
    let r = between(pts, from, to);
    match lvl {
        0 => r.len(),
        _ => pts.range(r).filter(|p| read_at(p.1, lvl)).count(),
    }
}

/// The sample of a kept item for this view, if it counts: successful, with a value, and (for
/// `ttft`) its early first-token copy standing for a record that has one.
fn record_value(s: LatencySample<'_>, view: &str, value: &str) -> Option<f64> {
    if !s.ok() {
        return None;
    }
    if let LatencySample::Record(r) = s
        && view == "ttft"
        && r.ttft_early
    {
        return None;
    }
    s.value(value)
}

/// The arm and sample of a record for an arm mirror, if it has an arm: its value when it
/// succeeded and has one, else NaN (counted, no value).
fn arm_value<'a>(r: &'a Rec, value: &str) -> Option<(&'a Label, f64)> {
    if r.ab_group.is_empty() {
        return None;
    }
    let v = if r.ok { r.value(value) } else { None };
    Some((&r.ab_group, v.unwrap_or(f64::NAN)))
}

/// Give back the room of a queue a burst grew far beyond what it holds now.
fn shrink<T>(q: &mut VecDeque<T>) {
    if q.capacity() > 2 * q.len() + 1024 {
        q.shrink_to_fit();
    }
}

impl Mirror {
    fn new(by: By, epoch: u64, next: [u64; 2], horizon: i64) -> Mirror {
        Mirror {
            by,
            epoch,
            next,
            horizon,
            spans: Vec::new(),
            order: [VecDeque::new(), VecDeque::new()],
            lines: BTreeMap::new(),
            windows: HashMap::new(),
            used: i64::MIN,
            cuts: Cuts::default(),
            thinned: (Cuts::default(), i64::MIN),
        }
    }

    fn log(&mut self, instance: &Label, (at, id): (i64, u64), v: f64, added: bool) {
        if v.is_nan() {
            return;
        }
        for ((scope, _), w) in self.windows.iter_mut() {
            if w.stale || scope.as_ref().is_some_and(|s| s != instance) || !read_at(id, w.level) {
                continue;
            }
            if w.log.len() > w.vals.len().max(MERGE_FROM) {
                w.stale = true;
                w.log = Vec::new();
            } else {
                w.log.push((at, v, added));
            }
        }
    }

    fn add(&mut self, src: usize, seq: u64, at: i64, instance: &Label, v: f64) {
        if at <= self.horizon {
            return;
        }
        let id = seq << 1 | src as u64;
        let pts = self.lines.entry(instance.clone()).or_default();
        let i = pts.partition_point(|p| (p.0, p.1) < (at, id));
        pts.insert(i, (at, id, v));
        self.order[src].push_back((seq, at, instance.clone()));
        self.log(instance, (at, id), v, true);
    }

    fn remove(&mut self, src: usize, seq: u64, at: i64, instance: &Label) {
        let id = seq << 1 | src as u64;
        let Some(pts) = self.lines.get_mut(instance) else {
            return;
        };
        let i = pts.partition_point(|p| (p.0, p.1) < (at, id));
        if !pts.get(i).is_some_and(|p| p.0 == at && p.1 == id) {
            return;
        }
        let v = pts.remove(i).map_or(f64::NAN, |p| p.2);
        if pts.is_empty() {
            self.lines.remove(instance);
        }
        self.log(instance, (at, id), v, false);
    }

    /// Drop what the kept queue evicted, read what it was pushed since, and forget samples at
    /// or before `horizon`.
    fn follow(&mut self, inputs: &Inputs, model: &str, view: &str, value: &str, kept: KeptSeq) {
        let fronts = [kept.records.0, kept.early.0];
        for (src, front) in fronts.into_iter().enumerate() {
            while let Some((seq, at, inst)) = self.order[src].front().cloned() {
                if seq >= front && at > self.horizon {
                    break;
                }
                self.order[src].pop_front();
                self.remove(src, seq, at, &inst);
            }
        }
        let start = self.next[0].max(kept.records.0);
        for (seq, r) in inputs.records_since(model, start) {
            let sample = match self.by {
                By::Instance => {
                    record_value(LatencySample::Record(r), view, value).map(|v| (&r.instance, v))
                }
                By::Arm => arm_value(r, value),
                By::Records => Some((&r.instance, f64::NAN)),
                By::Failures => r.server_failure.then_some((&r.instance, f64::NAN)),
            };
            if let Some((line, v)) = sample {
                self.add(0, seq, r.at_ms, line, v);
            }
        }
        if view == "ttft" && self.by == By::Instance {
            let start = self.next[1].max(kept.early.0);
            for (seq, f) in inputs.early_since(model, start) {
                if let Some(v) = record_value(LatencySample::FirstToken(f), view, value) {
                    self.add(1, seq, f.at_ms, &f.instance, v);
                }
            }
        }
        self.next = [kept.records.1, kept.early.1];
        let horizon = self.horizon;
        let mut dropped = Vec::new();
        for (inst, pts) in self.lines.iter_mut() {
            while let Some(p) = pts.front().copied().filter(|p| p.0 <= horizon) {
                pts.pop_front();
                dropped.push((inst.clone(), p));
            }
        }
        self.cuts = inputs.cuts(model);
        let (done, at) = self.thinned;
        if self.cuts.moved_since(&done)
            && (self.used < at || self.used.saturating_sub(at) >= THIN_EVERY_MS)
        {
            self.drop_thinned(&mut dropped);
        }
        for (inst, p) in dropped {
            self.log(&inst, (p.0, p.1), p.2, false);
        }
        self.lines.retain(|_, pts| !pts.is_empty());
        self.lines.values_mut().for_each(shrink);
        self.order.iter_mut().for_each(shrink);
    }

    /// Drop the samples the thinning now leaves out (handed to `dropped`) and their places in
    /// the push order.
    fn drop_thinned(&mut self, dropped: &mut Vec<(Label, Point)>) {
        let (cuts, done) = (self.cuts, self.thinned.0);
        for (inst, pts) in self.lines.iter_mut() {
            let (Some(first), Some(last)) = (pts.front(), pts.back()) else {
                continue;
            };
            if !cuts.moved_across(&done, first.0, last.0) {
                continue;
            }
            pts.retain(|p| {
                let keep = cuts.keeps(p.0, p.1);
                if !keep {
                    dropped.push((inst.clone(), *p));
                }
                keep
            });
        }
        for (src, order) in self.order.iter_mut().enumerate() {
            order.retain(|o| cuts.keeps(o.1, super::thin::sample_id(o.0, src as u64)));
        }
        self.thinned = (cuts, self.used);
    }

    /// Bytes allocated for its samples: the lines, the push order and the windows' values and
    /// logs (labels are shared with the kept records and not counted; nor are the few bytes of
    /// each line's, window's and the mirror's own header).
    fn bytes(&self) -> usize {
        let lines: usize = self.lines.values().map(VecDeque::capacity).sum();
        let order: usize = self.order.iter().map(VecDeque::capacity).sum();
        let windows: usize = self
            .windows
            .values()
            .map(|w| w.vals.capacity() * size_of::<f64>() + w.log.capacity() * size_of::<Change>())
            .sum();
        lines * size_of::<Point>() + order * size_of::<Order>() + windows
    }
}

/// Values of `pts` in (from, to] of the chosen instance(s).
fn collect(
    lines: &BTreeMap<Label, VecDeque<Point>>,
    scope: Option<&str>,
    (from, to): (i64, i64),
    lvl: u8,
) -> Vec<f64> {
    let mut v: Vec<f64> = match scope {
        Some(i) => lines
            .get(i)
            .map(|pts| range(pts, from, to, lvl).collect())
            .unwrap_or_default(),
        None => lines
            .values()
            .flat_map(|pts| range(pts, from, to, lvl))
            .collect(),
    };
    v.sort_by(f64::total_cmp);
    v
}

/// Parts of (a0, a1] outside (b0, b1], when the two overlap; None when they do not.
fn outside(a: (i64, i64), b: (i64, i64)) -> Option<[(i64, i64); 2]> {
    if a.1 <= b.0 || b.1 <= a.0 {
        return None;
    }
    Some([(a.0, a.1.min(b.0)), (a.0.max(b.1), a.1)])
}

/// `vals` (sorted) with `add` merged in and `del` taken out (each of `del` once, an equal value
/// standing for it); None when one of `del` is not there.
fn apply(vals: &mut Vec<f64>, mut add: Vec<f64>, mut del: Vec<f64>) -> Option<()> {
    if add.len() + del.len() < MERGE_FROM {
        for v in add {
            let i = vals.partition_point(|x| x.total_cmp(&v).is_lt());
            vals.insert(i, v);
        }
        for v in del {
            let i = vals.partition_point(|x| x.total_cmp(&v).is_lt());
            if !vals.get(i).is_some_and(|x| x.total_cmp(&v).is_eq()) {
                return None;
            }
            vals.remove(i);
        }
        return Some(());
    }
    add.sort_by(f64::total_cmp);
    del.sort_by(f64::total_cmp);
    let mut out = Vec::with_capacity(vals.len() + add.len());
    let (mut i, mut j) = (0, 0);
    while i < vals.len() || j < add.len() {
        if j >= add.len() || (i < vals.len() && vals[i].total_cmp(&add[j]).is_le()) {
            out.push(vals[i]);
            i += 1;
        } else {
            out.push(add[j]);
            j += 1;
        }
    }
    let mut k = 0;
    out.retain(|x| {
        if k < del.len() && x.total_cmp(&del[k]).is_eq() {
            k += 1;
            false
        } else {
            true
        }
    });
    if k < del.len() {
        return None;
    }
    *vals = out;
    Some(())
}

impl Window {
    /// Bring the window to (from, to] of the mirror's samples now, read at `lvl`.
    fn read(
        &mut self,
        lines: &BTreeMap<Label, VecDeque<Point>>,
        scope: Option<&str>,
        (from, to): (i64, i64),
        lvl: u8,
    ) {
        if lvl != self.level {
            return self.rebuild(lines, scope, (from, to), lvl);
        }
        let moves = (!self.stale)
            .then(|| {
                let old = (self.from, self.to);
                Some((outside(old, (from, to))?, outside((from, to), old)?))
            })
            .flatten();
        let Some((leaving, entering)) = moves else {
            return self.rebuild(lines, scope, (from, to), lvl);
        };
        let (mut add, mut del) = (Vec::new(), Vec::new());
        for &(at, v, added) in &self.log {
            if at > self.from && at <= self.to {
                if added { add.push(v) } else { del.push(v) }
            }
        }
        let pick = |parts: [(i64, i64); 2], out: &mut Vec<f64>| {
            for (a, b) in parts.into_iter().filter(|(a, b)| a < b) {
                match scope {
                    Some(i) => {
                        out.extend(lines.get(i).into_iter().flat_map(|p| range(p, a, b, lvl)))
                    }
                    None => out.extend(lines.values().flat_map(|p| range(p, a, b, lvl))),
                }
            }
        };
        pick(entering, &mut add);
        pick(leaving, &mut del);
        if add.len() + del.len() > self.vals.len() + MERGE_FROM {
            return self.rebuild(lines, scope, (from, to), lvl);
        }
        // Adds first: a sample added and removed since the last read cancels out.
        let mut vals = std::mem::take(&mut self.vals);
        let mut merged = apply(&mut vals, add, Vec::new());
        if merged.is_some() {
            merged = apply(&mut vals, Vec::new(), del);
        }
        if merged.is_none() {
            return self.rebuild(lines, scope, (from, to), lvl);
        }
        if vals.capacity() > 2 * vals.len() + 1024 {
            vals.shrink_to_fit();
        }
        self.vals = vals;
        self.log.clear();
        (self.from, self.to) = (from, to);
    }

    fn rebuild(
        &mut self,
        lines: &BTreeMap<Label, VecDeque<Point>>,
        scope: Option<&str>,
        (from, to): (i64, i64),
        lvl: u8,
    ) {
        self.vals = collect(lines, scope, (from, to), lvl);
        self.log = Vec::new();
        self.stale = false;
        self.level = lvl;
        self.rebuilds += 1;
        (self.from, self.to) = (from, to);
    }
}

type Key = (String, String, String, By);

fn key(model: &str, view: &str, value: &str) -> Key {
    (
        model.to_string(),
        view.to_string(),
        value.to_string(),
        By::Instance,
    )
}

fn arm_key(model: &str, value: &str) -> Key {
    (model.to_string(), String::new(), value.to_string(), By::Arm)
}

fn outcome_key(model: &str, by: By) -> Key {
    (model.to_string(), String::new(), String::new(), by)
}

/// A model's records and server failures per instance, as `LatencyWindows::sync_outcomes` left
/// them, every kept record after `from` among them: counted in time ranges by binary search.
/// Ranges are meant to start at or after `from` (before it, only what is mirrored counts).
/// Where the records are thinned, every range is read at the level of a window reaching back
/// to `from` (see `reading_from`), so counts of nested ranges grow with the range.
#[derive(Clone, Copy)]
pub struct Outcomes<'a> {
    records: &'a Mirror,
    failures: &'a Mirror,
    level: u8,
}

/// The thinning level a range of a mirror is read at.
fn range_level(m: &Mirror, from: i64) -> u8 {
    m.cuts.window_level(from)
}

impl<'a> Outcomes<'a> {
    /// The same outcomes read at the level of a window reaching back to `from`.
    pub fn reading_from(self, from: i64) -> Outcomes<'a> {
        Outcomes {
            level: range_level(self.records, from),
            ..self
        }
    }

    /// The instances with records in the mirror (the empty one among them), in order.
    pub fn instances(&self) -> impl Iterator<Item = &'a Label> + 'a {
        self.records.lines.keys()
    }

    /// (server failures, records) of `instance` in `(from, to]` (none when `to <= from`).
    pub fn count(&self, instance: &str, (from, to): (i64, i64)) -> (u64, u64) {
        let n = |m: &Mirror| {
            m.lines
                .get(instance)
                .map_or(0, |pts| count(pts, from, to, self.level) as u64)
        };
        (n(self.failures), n(self.records))
    }

    /// The times of `instance`'s records (with `failed`, of its server failures) in
    /// `(from, to]`, oldest first.
    pub fn times(
        &self,
        instance: &str,
        failed: bool,
        (from, to): (i64, i64),
    ) -> impl Iterator<Item = i64> + 'a {
        let m = if failed { self.failures } else { self.records };
        let lvl = self.level;
        m.lines
            .get(instance)
            .into_iter()
            .flat_map(move |pts| pts.range(between(pts, from, to)))
            .filter(move |p| read_at(p.1, lvl))
            .map(|p| p.0)
    }
}

impl LatencyWindows {
    /// Bring the mirror of `model`'s `value` as the rules on `view` (their signal) read it up to
    /// date, its windows reaching back `span` before `now`. False when the model keeps no
    /// records.
    pub fn sync(
        &mut self,
        inputs: &Inputs,
        (model, view, value): (&str, &str, &str),
        span: i64,
        now: i64,
    ) -> bool {
        self.sync_key(inputs, key(model, view, value), span, now)
    }

    fn sync_key(&mut self, inputs: &Inputs, k: Key, span: i64, now: i64) -> bool {
        if now - self.last_gc >= IDLE_MS / 4 || now < self.last_gc {
            self.last_gc = now;
            self.mirrors.retain(|_, m| {
                let reach = m.spans.iter().map(|s| s.0).max().unwrap_or(0);
                now >= m.used && now - m.used <= IDLE_MS + reach
            });
        }
        let Some(kept) = inputs.kept_seq(&k.0) else {
            self.mirrors.remove(&k);
            return false;
        };
        let by = k.3;
        if !self.mirrors.contains_key(&k) {
            let m = Mirror::new(by, kept.epoch, [0, 0], i64::MAX);
            self.mirrors.insert(k.clone(), m);
        }
        let Some(m) = self.mirrors.get_mut(&k) else {
            return false;
        };
        match m.spans.iter_mut().find(|s| s.0 == span) {
            Some(s) => s.1 = now,
            None => m.spans.push((span, now)),
        }
        m.spans.retain(|s| now >= s.1 && now - s.1 <= IDLE_MS);
        let reach = m.spans.iter().map(|s| s.0).max().unwrap_or(span);
        let horizon = now.saturating_sub(reach);
        if kept.epoch != m.epoch
            || horizon < m.horizon
            || now < m.used
            || m.next[0] > kept.records.1
            || m.next[1] > kept.early.1
        {
            // A new queue, a longer reach or the clock going back: read everything again.
            let spans = std::mem::take(&mut m.spans);
            *m = Mirror::new(by, kept.epoch, [kept.records.0, kept.early.0], horizon);
            m.spans = spans;
        }
        m.horizon = horizon;
        m.used = now;
        m.follow(inputs, &k.0, &k.1, &k.2, kept);
        true
    }

    /// The sorted values in (from, to] of an instance (or, with None, of all), as `sync` left
    /// them at `now`; None when the mirror was not synced at `now` or does not reach `from`.
    pub fn window(
        &mut self,
        (model, view, value): (&str, &str, &str),
        now: i64,
        scope: Option<&str>,
        slot: Slot,
        range: (i64, i64),
    ) -> Option<&[f64]> {
        self.window_key(&key(model, view, value), now, scope, slot, range)
    }

    fn window_key(
        &mut self,
        k: &Key,
        now: i64,
        scope: Option<&str>,
        slot: Slot,
        (from, to): (i64, i64),
    ) -> Option<&[f64]> {
        let m = self.mirrors.get_mut(k)?;
        if m.used != now || from < m.horizon || to < from {
            return None;
        }
        let lines = &m.lines;
        let w = m
            .windows
            .entry((scope.map(Label::new), slot))
            .or_insert_with(|| Window {
                from,
                to,
                vals: Vec::new(),
                log: Vec::new(),
                stale: true,
                level: 0,
                used: now,
                rebuilds: 0,
            });
        w.read(lines, scope, (from, to), m.cuts.window_level(from));
        w.used = now;
        let idle = |w: &Window| now >= w.used && now - w.used <= IDLE_MS + (w.to - w.from);
        if m.windows.len() > 64 || m.windows.values().any(|w| !idle(w)) {
            m.windows.retain(|_, w| idle(w));
        }
        m.windows
            .get(&(scope.map(Label::new), slot))
            .map(|w| w.vals.as_slice())
    }

    /// Sorted values of `value` of `model`'s successful records (as `inputs::values` reads
    /// them: no early first tokens) in each of `ranges`, all of its instances, synced at `now`
    /// with a reach of `reach`; None where the windows cannot answer.
    pub fn record_windows<const N: usize>(
        &mut self,
        inputs: &Inputs,
        (model, value): (&str, &str),
        (now, reach): (i64, i64),
        ranges: [(Slot, (i64, i64)); N],
    ) -> Option<[Vec<f64>; N]> {
        let series = (model, "", value);
        if !self.sync(inputs, series, reach, now) {
            return None;
        }
        let mut out = [(); N].map(|_| Vec::new());
        for (k, (slot, range)) in ranges.into_iter().enumerate() {
            out[k] = self.window(series, now, None, slot, range)?.to_vec();
        }
        Some(out)
    }

    /// Instances with samples in the mirror synced at `now`, in order, with how many are in
    /// each of `ranges`; None as for `window`.
    pub fn counts(
        &self,
        (model, view, value): (&str, &str, &str),
        now: i64,
        ranges: &[(i64, i64)],
    ) -> Option<Vec<(Label, Vec<usize>)>> {
        self.counts_key(&key(model, view, value), now, ranges)
    }

    fn counts_key(
        &self,
        k: &Key,
        now: i64,
        ranges: &[(i64, i64)],
    ) -> Option<Vec<(Label, Vec<usize>)>> {
        let m = self.mirrors.get(k)?;
        if m.used != now || ranges.iter().any(|r| r.0 < m.horizon || r.1 < r.0) {
            return None;
        }
        Some(
            m.lines
                .iter()
                .map(|(i, pts)| {
                    (
                        i.clone(),
                        ranges
                            .iter()
                            .map(|&(a, b)| count(pts, a, b, range_level(m, a)))
                            .collect(),
                    )
                })
                .collect(),
        )
    }

    /// Bring the mirror of `model`'s records by A/B arm (`value` of the successful ones) up to
    /// date, its windows reaching back `span` before `now`. False when the model keeps no
    /// records.
    pub fn sync_arms(
        &mut self,
        inputs: &Inputs,
        (model, value): (&str, &str),
        span: i64,
        now: i64,
    ) -> bool {
        self.sync_key(inputs, arm_key(model, value), span, now)
    }

    /// The A/B arms (non-empty groups) with records in `(from, to]` of the arm mirror synced at
    /// `now`, in order, with how many (successful or not); None as for `window`.
    pub fn arm_counts(
        &self,
        (model, value): (&str, &str),
        now: i64,
        (from, to): (i64, i64),
    ) -> Option<Vec<(Label, usize)>> {
        let counts = self.counts_key(&arm_key(model, value), now, &[(from, to)])?;
        Some(
            counts
                .into_iter()
                .filter_map(|(arm, n)| Some((arm, n.first().copied().filter(|n| *n > 0)?)))
                .collect(),
        )
    }

    /// Sorted values of `value` of the successful records of `arm` in `(from, to]`, as
    /// `sync_arms` left them at `now`; None as for `window`.
    pub fn arm_window(
        &mut self,
        (model, value): (&str, &str),
        now: i64,
        arm: &str,
        slot: Slot,
        range: (i64, i64),
    ) -> Option<&[f64]> {
        self.window_key(&arm_key(model, value), now, Some(arm), slot, range)
    }

    /// Bring the mirrors of `model`'s records and of its server failures, per instance, up to
    /// date, reaching back `span` before `now` (`error_burst`). False when the model keeps no
    /// records.
    pub fn sync_outcomes(&mut self, inputs: &Inputs, model: &str, span: i64, now: i64) -> bool {
        self.sync_key(inputs, outcome_key(model, By::Records), span, now)
            && self.sync_key(inputs, outcome_key(model, By::Failures), span, now)
    }

    /// `model`'s records and server failures as `sync_outcomes` left them at `now`, every kept
    /// record after `from` among them; None when they were not synced at `now` or do not reach
    /// back to `from`.
    pub fn outcomes(&self, model: &str, now: i64, from: i64) -> Option<Outcomes<'_>> {
        let get = |by| {
            self.mirrors
                .get(&outcome_key(model, by))
                .filter(|m| m.used == now && from >= m.horizon)
        };
        let records = get(By::Records)?;
        Some(Outcomes {
            records,
            failures: get(By::Failures)?,
            level: range_level(records, from),
        })
    }

    /// Bytes allocated for the mirrored samples and the windows' values: what the windows keep
    /// per record within the rules' reach (read from the containers' room, not by sample).
    pub fn bytes(&self) -> usize {
        self.mirrors.values().map(Mirror::bytes).sum()
    }
}

#[cfg(test)]
#[path = "windows_tests.rs"]
mod tests;
