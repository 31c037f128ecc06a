// Spend budgets (`budgets:`): a daily or monthly amount in US dollars for a model, a tenant, both
// or everything, counted by the alert engine from each record's cost (`cost_usd`, the price
// table's) in UTC calendar periods; seeded at start from the stored records of the current
// period; their state for the `budget_burn` detector, and their gauges on `/metrics`.

use crate::kernel::duration::HumanDuration;
use crate::kernel::telemetry::Metrics;
use chrono::{Datelike, NaiveDate};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use tokenwatch_store::SpendRow;

const DAY_MS: i64 = 24 * 3600 * 1000;
/// Spend is kept per minute for the burn rate.
const BUCKET_MS: i64 = 60_000;
/// The longest `burn_window` a budget may have.
pub const MAX_BURN_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The calendar period a budget's amount is for (UTC).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum BudgetPeriod {
    /// From 00:00 UTC to the next.
    Daily,
    /// From the 1st of the month, 00:00 UTC, to the next month's.
    #[default]
    Monthly,
}

impl BudgetPeriod {
    pub fn name(self) -> &'static str {
        match self {
            BudgetPeriod::Daily => "daily",
            BudgetPeriod::Monthly => "monthly",
        }
    }

    /// `[start, end)` of the period holding `at_ms`, Unix milliseconds.
    pub fn bounds(self, at_ms: i64) -> (i64, i64) {
        let day_start = at_ms.div_euclid(DAY_MS) * DAY_MS;
        match self {
            BudgetPeriod::Daily => (day_start, day_start + DAY_MS),
            BudgetPeriod::Monthly => {
                let first_of = |d: Option<NaiveDate>| {
                    d.and_then(|d| d.and_hms_opt(0, 0, 0))
                        .map(|t| t.and_utc().timestamp_millis())
                };
                let date = chrono::DateTime::from_timestamp_millis(at_ms).map(|t| t.date_naive());
                let start = first_of(date.and_then(|d| d.with_day(1)));
                let next = date.and_then(|d| {
                    let (y, m) = if d.month() == 12 {
                        (d.year() + 1, 1)
                    } else {
                        (d.year(), d.month() + 1)
                    };
                    NaiveDate::from_ymd_opt(y, m, 1)
                });
                match (start, first_of(next)) {
                    (Some(s), Some(e)) => (s, e),
                    // Outside chrono's dates (none a clock gives): a 30-day period.
                    _ => (day_start, day_start + 30 * DAY_MS),
                }
            }
        }
    }
}

/// One entry of `budgets:`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// Names the budget in alerts, gauges (`budget` label) and the API; unique.
    pub name: String,
    /// `daily` or `monthly` (default), UTC calendar periods.
    #[serde(default)]
    pub period: BudgetPeriod,
    /// US dollars per period; more than 0.
    pub amount_usd: f64,
    /// Only this model's spend (the model id as counted); absent: every model.
    #[serde(default)]
    pub model: Option<String>,
    /// Only this tenant's spend (the tenant header's value or `key-<hash>`); absent: every tenant.
    #[serde(default)]
    pub tenant: Option<String>,
    /// The spend rate is measured over this much time back (1m to 24h). Default 1h.
    #[serde(default = "default_burn_window")]
    pub burn_window: HumanDuration,
}

fn default_burn_window() -> HumanDuration {
    HumanDuration(Duration::from_secs(3600))
}

/// Checks `budgets:`. Err: (key path, message).
pub fn validate(budgets: &[BudgetConfig]) -> Result<(), (String, String)> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, b) in budgets.iter().enumerate() {
        let at = |k: &str| format!("budgets[{i}].{k}");
        if b.name.trim().is_empty() {
            return Err((at("name"), "a budget needs a name".into()));
        }
        if !seen.insert(b.name.as_str()) {
            return Err((at("name"), format!("{:?} names another budget too", b.name)));
        }
        if !(b.amount_usd.is_finite() && b.amount_usd > 0.0) {
            return Err((
                at("amount_usd"),
                format!(
                    "{} is not an amount: US dollars, finite, more than 0",
                    b.amount_usd
                ),
            ));
        }
        for (key, v) in [("model", &b.model), ("tenant", &b.tenant)] {
            if v.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err((at(key), "must not be empty (leave it out for all)".into()));
            }
        }
        let w = b.burn_window.0;
        if w < Duration::from_secs(60) || w > MAX_BURN_WINDOW {
            return Err((at("burn_window"), "must be from 1m to 24h".into()));
        }
    }
    Ok(())
}

/// One budget's state.
#[derive(Debug, Clone)]
struct Budget {
    cfg: BudgetConfig,
    /// The current period, `[start, end)`.
    period: (i64, i64),
    /// Spent in the current period.
    spent: f64,
    /// Spend per minute (minute start, USD), at most `burn_window` back.
    minutes: VecDeque<(i64, f64)>,
}

impl Budget {
    fn covers(&self, model: &str, tenant: &str) -> bool {
        self.cfg.model.as_deref().is_none_or(|m| m == model)
            && self.cfg.tenant.as_deref().is_none_or(|t| t == tenant)
    }

    /// Moves to the period holding `now_ms` when the current one is over.
    fn roll(&mut self, now_ms: i64) {
        if now_ms >= self.period.1 {
            self.period = self.cfg.period.bounds(now_ms);
            self.spent = 0.0;
        }
    }
}

/// A budget as of a time: what is spent, what is left and how fast it goes.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetStatus {
    pub name: String,
    pub period: BudgetPeriod,
    pub amount_usd: f64,
    pub spent_usd: f64,
    /// `amount_usd - spent_usd` (below 0: overspent).
    pub remaining_usd: f64,
    pub period_start_ms: i64,
    pub period_end_ms: i64,
    /// Spend per second over the budget's `burn_window`.
    pub burn_usd_per_s: f64,
    pub burn_window_s: f64,
    /// The spend rate over the pace that spends exactly what is left by the period's end: 1 on
    /// pace, 2 runs out halfway through the rest of the period; infinite once overspent.
    pub burn_rate: f64,
    /// Seconds until the rest is spent at the current rate: 0 once spent, None while nothing
    /// is being spent.
    pub time_to_exhaustion_s: Option<f64>,
    /// `budget`, and `model_id` / `tenant` when the budget is for one.
    pub labels: BTreeMap<String, String>,
}

/// Every budget, fed by the engine's records.
#[derive(Default)]
pub struct BudgetTracker {
    budgets: Vec<Budget>,
    gauges: Option<BudgetGauges>,
}

impl BudgetTracker {
    /// The budgets of `cfgs` at zero spend, in the periods holding `now_ms`.
    pub fn new(cfgs: &[BudgetConfig], now_ms: i64) -> BudgetTracker {
        BudgetTracker {
            budgets: cfgs
                .iter()
                .map(|c| Budget {
                    cfg: c.clone(),
                    period: c.period.bounds(now_ms),
                    spent: 0.0,
                    minutes: VecDeque::new(),
                })
                .collect(),
            gauges: None,
        }
    }

    /// Sets the gauges on `/metrics` from each `publish`.
    pub fn publishing(mut self, metrics: &Metrics) -> BudgetTracker {
        self.gauges = Some(BudgetGauges::register(metrics));
        self
    }

    pub fn is_empty(&self) -> bool {
        self.budgets.is_empty()
    }

    /// Each budget's spend so far in its current period, before `now_ms`, from `spend(start,
    /// end)` (the stored records' spend per model and tenant).
    pub fn seed<E>(
        &mut self,
        now_ms: i64,
        mut spend: impl FnMut(i64, i64) -> Result<Vec<SpendRow>, E>,
    ) -> Result<(), E> {
        for b in &mut self.budgets {
            b.roll(now_ms);
            let rows = spend(b.period.0, now_ms)?;
            b.spent = rows
                .iter()
                .filter(|r| b.covers(&r.model, &r.tenant))
                .map(|r| r.cost_usd)
                .sum();
        }
        Ok(())
    }

    /// Counts a request's cost into every budget it falls under (`at_ms`: when it became known).
    pub fn observe(&mut self, model: &str, tenant: &str, at_ms: i64, cost_usd: f64) {
        if !(cost_usd.is_finite() && cost_usd > 0.0) {
            return;
        }
        let minute = at_ms.div_euclid(BUCKET_MS) * BUCKET_MS;
        for b in self.budgets.iter_mut().filter(|b| b.covers(model, tenant)) {
            b.roll(at_ms);
            if at_ms < b.period.0 {
                continue; // a late record of the previous period
            }
            b.spent += cost_usd;
            match b.minutes.back_mut() {
                Some((m, usd)) if *m == minute => *usd += cost_usd,
                _ => b.minutes.push_back((minute, cost_usd)),
            }
            let keep_from = at_ms - b.cfg.burn_window.0.as_millis() as i64 - BUCKET_MS;
            while b.minutes.front().is_some_and(|(m, _)| *m < keep_from) {
                b.minutes.pop_front();
            }
        }
    }

    /// Every budget as of `now_ms` (a period that ended reads as the new one, nothing spent).
    pub fn statuses(&self, now_ms: i64) -> Vec<BudgetStatus> {
        self.budgets
            .iter()
            .map(|b| {
                let (period, spent) = if now_ms >= b.period.1 {
                    (b.cfg.period.bounds(now_ms), 0.0)
                } else {
                    (b.period, b.spent)
                };
                let window_ms = b.cfg.burn_window.0.as_millis() as i64;
                let recent: f64 = b
                    .minutes
                    .iter()
                    .filter(|(m, _)| *m + BUCKET_MS > now_ms - window_ms && *m >= period.0)
                    .map(|(_, usd)| usd)
                    .sum();
                status(&b.cfg, period, spent, recent, now_ms)
            })
            .collect()
    }

    /// Sets the gauges from the statuses at `now_ms`.
    pub fn publish(&self, now_ms: i64) {
        if let Some(g) = &self.gauges {
            for s in self.statuses(now_ms) {
                g.set(&s);
            }
        }
    }
}

/// A budget's status from what its period has spent so far and what its burn window spent.
fn status(
    cfg: &BudgetConfig,
    period: (i64, i64),
    spent: f64,
    recent_usd: f64,
    now_ms: i64,
) -> BudgetStatus {
    let window_s = cfg.burn_window.0.as_millis() as f64 / 1000.0;
    let rate = recent_usd / window_s;
    let remaining = cfg.amount_usd - spent;
    let left_s = ((period.1 - now_ms) as f64 / 1000.0).max(0.0);
    let (burn_rate, exhaustion) = if remaining <= 0.0 {
        (f64::INFINITY, Some(0.0))
    } else if rate > 0.0 {
        (rate * left_s / remaining, Some(remaining / rate))
    } else {
        (0.0, None)
    };
    let mut labels = BTreeMap::from([("budget".to_string(), cfg.name.clone())]);
    if let Some(m) = &cfg.model {
        labels.insert("model_id".into(), m.clone());
    }
    if let Some(t) = &cfg.tenant {
        labels.insert("tenant".into(), t.clone());
    }
    BudgetStatus {
        name: cfg.name.clone(),
        period: cfg.period,
        amount_usd: cfg.amount_usd,
        spent_usd: spent,
        remaining_usd: remaining,
        period_start_ms: period.0,
        period_end_ms: period.1,
        burn_usd_per_s: rate,
        burn_window_s: window_s,
        burn_rate,
        time_to_exhaustion_s: exhaustion,
        labels,
    }
}

/// A budget's status read from the stored records alone (the API's): its period's spend and its
/// burn window's, from `spend(since, until)`.
pub fn status_from_spend<E>(
    cfg: &BudgetConfig,
    now_ms: i64,
    mut spend: impl FnMut(i64, i64) -> Result<Vec<SpendRow>, E>,
) -> Result<BudgetStatus, E> {
    let period = cfg.period.bounds(now_ms);
    let covered = |rows: Vec<SpendRow>| -> f64 {
        rows.iter()
            .filter(|r| {
                cfg.model.as_deref().is_none_or(|m| m == r.model)
                    && cfg.tenant.as_deref().is_none_or(|t| t == r.tenant)
            })
            .map(|r| r.cost_usd)
            .sum()
    };
    let spent = covered(spend(period.0, now_ms)?);
    let window_start = (now_ms - cfg.burn_window.0.as_millis() as i64).max(period.0);
    let recent = covered(spend(window_start, now_ms)?);
    Ok(status(cfg, period, spent, recent, now_ms))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabels {
    budget: String,
    period: String,
}

type F64Gauge = Gauge<f64, AtomicU64>;

/// `tokenwatch_budget_*` on `/metrics`, one series per budget (budget names come from the
/// configuration, so they are bounded).
struct BudgetGauges {
    amount: Family<BudgetLabels, F64Gauge>,
    spent: Family<BudgetLabels, F64Gauge>,
    remaining: Family<BudgetLabels, F64Gauge>,
    burn_rate: Family<BudgetLabels, F64Gauge>,
    exhaustion: Family<BudgetLabels, F64Gauge>,
}

impl BudgetGauges {
    fn register(m: &Metrics) -> BudgetGauges {
        let g = BudgetGauges {
            amount: Family::default(),
            spent: Family::default(),
            remaining: Family::default(),
            burn_rate: Family::default(),
            exhaustion: Family::default(),
        };
        for (name, help, family) in [
            (
                "tokenwatch_budget_amount_usd",
                "The budget's amount per period, US dollars",
                &g.amount,
            ),
            (
                "tokenwatch_budget_spent_usd",
                "Spent in the budget's current period, US dollars (priced requests; counted since the start of the period from the stored records, then as requests finish)",
                &g.spent,
            ),
            (
                "tokenwatch_budget_remaining_usd",
                "Left of the budget in its current period, US dollars (below 0: overspent)",
                &g.remaining,
            ),
            (
                "tokenwatch_budget_burn_rate",
                "Spend rate over the budget's burn_window divided by the rate that spends exactly what is left by the period's end (1 on pace; +Inf overspent)",
                &g.burn_rate,
            ),
            (
                "tokenwatch_budget_time_to_exhaustion_seconds",
                "Seconds until the budget is spent at the spend rate over its burn_window (0 spent, +Inf while nothing is spent)",
                &g.exhaustion,
            ),
        ] {
            m.register(name, help, family.clone());
        }
        g
    }

    fn set(&self, s: &BudgetStatus) {
        let l = BudgetLabels {
            budget: s.name.clone(),
            period: s.period.name().into(),
        };
        self.amount.get_or_create(&l).set(s.amount_usd);
        self.spent.get_or_create(&l).set(s.spent_usd);
        self.remaining.get_or_create(&l).set(s.remaining_usd);
        self.burn_rate.get_or_create(&l).set(s.burn_rate);
        self.exhaustion
            .get_or_create(&l)
            .set(s.time_to_exhaustion_s.unwrap_or(f64::INFINITY));
    }
}

/// A duration in words for alert text: `3h 20m`, `2d 4h`, `45s`.
pub fn human_duration(s: f64) -> String {
    if !s.is_finite() {
        return "never at this rate".into();
    }
    let s = s.max(0.0).round() as u64;
    let (d, h, m) = (s / 86_400, (s % 86_400) / 3600, (s % 3600) / 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, m) => format!("{m}m"),
        (0, h, 0) => format!("{h}h"),
        (0, h, m) => format!("{h}h {m}m"),
        (d, 0, _) => format!("{d}d"),
        (d, h, _) => format!("{d}d {h}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(rfc3339: &str) -> i64 {
        chrono::DateTime::parse_from_rfc3339(rfc3339)
            .unwrap()
            .timestamp_millis()
    }

    fn budget(name: &str, period: BudgetPeriod, amount: f64) -> BudgetConfig {
        BudgetConfig {
            name: name.into(),
            period,
            amount_usd: amount,
            model: None,
            tenant: None,
            burn_window: default_burn_window(),
        }
    }

    #[test]
    fn periods_are_utc_days_and_calendar_months() {
        let at = ms("2026-12-08T01:40:00Z");
        assert_eq!(
            BudgetPeriod::Daily.bounds(at),
            (ms("2026-12-08T00:00:00Z"), ms("2026-12-09T00:00:00Z"))
        );
        assert_eq!(
            BudgetPeriod::Monthly.bounds(at),
            (ms("2026-12-01T00:00:00Z"), ms("2027-01-01T00:00:00Z"))
        );
        assert_eq!(
            BudgetPeriod::Monthly.bounds(ms("2028-02-29T23:59:59Z")),
            (ms("2028-02-01T00:00:00Z"), ms("2028-03-01T00:00:00Z"))
        );
    }

    #[test]
    fn spend_counts_into_the_budgets_it_falls_under_and_projects_exhaustion() {
        let mut acme = budget("acme", BudgetPeriod::Daily, 100.0);
        acme.tenant = Some("acme".into());
        let mut m = budget("m", BudgetPeriod::Monthly, 1000.0);
        m.model = Some("m".into());
        let start = ms("2026-12-08T00:00:00Z");
        let mut t = BudgetTracker::new(&[acme, m], start);
        // $60 over the last hour, at noon: $60/h for acme with $40 left and 12 h to go.
        let noon = ms("2026-12-08T12:00:00Z");
        for k in 0..60 {
            t.observe("m", "acme", noon - 3_600_000 + k * 60_000, 1.0);
        }
        t.observe("other", "globex", noon - 1000, 5.0);
        let s = t.statuses(noon);
        let acme = &s[0];
        assert_eq!((acme.spent_usd, acme.remaining_usd), (60.0, 40.0));
        assert!(
            (acme.burn_usd_per_s * 3600.0 - 60.0).abs() < 1e-9,
            "{acme:?}"
        );
        let tte = acme.time_to_exhaustion_s.unwrap();
        assert!((tte - 2400.0).abs() < 1e-6, "{tte}");
        // 12 h left at $60/h against $40: 18x the pace.
        assert!((acme.burn_rate - 18.0).abs() < 1e-9, "{acme:?}");
        assert_eq!(acme.labels["tenant"], "acme");
        assert_eq!(
            s[1].spent_usd, 60.0,
            "the model's budget, whatever the tenant"
        );
        // Overspent: exhausted now.
        t.observe("m", "acme", noon, 50.0);
        let acme = &t.statuses(noon)[0];
        assert_eq!(
            (acme.remaining_usd, acme.time_to_exhaustion_s),
            (-10.0, Some(0.0))
        );
        assert!(acme.burn_rate.is_infinite());
        // Tomorrow: a new period, nothing spent, nothing burning.
        let next = ms("2026-12-09T00:30:00Z");
        let acme = &t.statuses(next)[0];
        assert_eq!((acme.spent_usd, acme.time_to_exhaustion_s), (0.0, None));
        t.observe("m", "acme", next, 2.0);
        assert_eq!(t.statuses(next)[0].spent_usd, 2.0);
    }

    #[test]
    fn seeded_from_the_stored_spend_of_the_period() {
        let mut b = budget("acme", BudgetPeriod::Monthly, 10.0);
        b.tenant = Some("acme".into());
        let now = ms("2026-12-08T12:00:00Z");
        let mut t = BudgetTracker::new(&[b], now);
        let row = |model: &str, tenant: &str, cost_usd: f64| SpendRow {
            model: model.into(),
            tenant: tenant.into(),
            cost_usd,
            requests: 1,
            priced_requests: 1,
        };
        let mut asked = Vec::new();
        t.seed::<()>(now, |from, to| {
            asked.push((from, to));
            Ok(vec![
                row("a", "acme", 2.5),
                row("b", "acme", 1.0),
                row("a", "globex", 9.0),
            ])
        })
        .unwrap();
        assert_eq!(asked, [(ms("2026-12-01T00:00:00Z"), now)]);
        assert_eq!(t.statuses(now)[0].spent_usd, 3.5);
    }

    #[test]
    fn the_store_gives_the_same_status_as_the_counts() {
        let mut b = budget("acme", BudgetPeriod::Daily, 100.0);
        b.tenant = Some("acme".into());
        let noon = ms("2026-12-08T12:00:00Z");
        let row = |cost_usd: f64| SpendRow {
            model: "m".into(),
            tenant: "acme".into(),
            cost_usd,
            requests: 1,
            priced_requests: 1,
        };
        // $60 in the last hour, $10 earlier in the day.
        let mut asked = Vec::new();
        let from_store = status_from_spend::<()>(&b, noon, |since, until| {
            asked.push((since, until));
            Ok(if since == ms("2026-12-08T00:00:00Z") {
                vec![row(70.0)]
            } else {
                vec![row(60.0)]
            })
        })
        .unwrap();
        assert_eq!(
            asked,
            [(ms("2026-12-08T00:00:00Z"), noon), (noon - 3_600_000, noon)]
        );
        let mut t = BudgetTracker::new(&[b], noon);
        t.observe("m", "acme", noon - 6 * 3_600_000, 10.0);
        for k in 0..60 {
            t.observe("m", "acme", noon - 3_600_000 + k * 60_000 + 1, 1.0);
        }
        let counted = &t.statuses(noon)[0];
        assert_eq!(
            (from_store.spent_usd, from_store.remaining_usd),
            (70.0, 30.0)
        );
        assert_eq!((counted.spent_usd, counted.remaining_usd), (70.0, 30.0));
        assert!((from_store.burn_usd_per_s - counted.burn_usd_per_s).abs() < 1e-12);
        assert!((from_store.time_to_exhaustion_s.unwrap() - 1800.0).abs() < 1e-6);
    }

    #[test]
    fn bad_budgets_are_refused_by_key_path() {
        let ok = budget("a", BudgetPeriod::Daily, 1.0);
        assert_eq!(validate(std::slice::from_ref(&ok)), Ok(()));
        let cases = [
            (vec![ok.clone(), ok.clone()], "budgets[1].name"),
            (
                vec![budget("", BudgetPeriod::Daily, 1.0)],
                "budgets[0].name",
            ),
            (
                vec![budget("a", BudgetPeriod::Daily, 0.0)],
                "budgets[0].amount_usd",
            ),
            (
                vec![budget("a", BudgetPeriod::Daily, f64::NAN)],
                "budgets[0].amount_usd",
            ),
            (
                vec![BudgetConfig {
                    tenant: Some(" ".into()),
                    ..ok.clone()
                }],
                "budgets[0].tenant",
            ),
            (
                vec![BudgetConfig {
                    burn_window: HumanDuration(Duration::from_secs(30)),
                    ..ok.clone()
                }],
                "budgets[0].burn_window",
            ),
        ];
        for (budgets, path) in cases {
            assert_eq!(validate(&budgets).unwrap_err().0, path);
        }
    }

    #[test]
    fn gauges_show_each_budget() {
        let metrics = Metrics::new();
        let t =
            BudgetTracker::new(&[budget("all", BudgetPeriod::Daily, 5.0)], 0).publishing(&metrics);
        t.publish(1000);
        let text = metrics.encode();
        for line in [
            "tokenwatch_budget_amount_usd{budget=\"all\",period=\"daily\"} 5.0",
            "tokenwatch_budget_remaining_usd{budget=\"all\",period=\"daily\"} 5.0",
            "tokenwatch_budget_time_to_exhaustion_seconds{budget=\"all\",period=\"daily\"} +Inf",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
    }

    #[test]
    fn durations_read_as_words() {
        assert_eq!(human_duration(45.0), "45s");
        assert_eq!(human_duration(2400.0), "40m");
        assert_eq!(human_duration(12_000.0), "3h 20m");
        assert_eq!(human_duration(190_000.0), "2d 4h");
        assert_eq!(
            (human_duration(3600.0), human_duration(172_800.0)),
            ("1h".into(), "2d".into())
        );
        assert_eq!(human_duration(f64::INFINITY), "never at this rate");
    }
}
