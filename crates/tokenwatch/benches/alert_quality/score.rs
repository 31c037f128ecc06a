// Scoring of a scenario against its labels: recall (alert naming model and instance), time to
// detect (and minus `for`), false alerts per hour, Alertmanager groups per incident, root cause.

use super::observe::SeenAlert;
use super::scenario::{Outcome, RanFault};
use super::truth;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone)]
pub struct FaultScore {
    pub label: String,
    pub spec: String,
    pub model: String,
    pub instance: String,
    pub expected: Vec<String>,
    /// A firing alert named the model and this instance within the fault's window.
    pub caught: bool,
    /// Only model-level alerts (no instance label) matched.
    pub model_only: bool,
    /// The first matching alert: rule, fault start → fired (s), fault start → pending (s).
    pub first: Option<(String, f64, f64)>,
    /// Rules of every matching alert.
    pub by: BTreeSet<String>,
    /// Some matching alert came from an expected rule or detector.
    pub expected_hit: bool,
    /// Fault start → the first critical alert naming model and this instance (a page), s.
    pub paged_s: Option<f64>,
    /// The optimal CUSUM's delay for this fault, from the replica's own metrics, plus one
    /// scrape interval (s); infinite when no statistic sees it.
    pub bound_s: f64,
    /// Requests per second the faulty replica served during the fault.
    pub replica_rps: f64,
}

#[derive(Debug, Clone)]
pub struct IncidentScore {
    pub alerts: usize,
    /// Distinct Alertmanager groups holding the incident's alerts.
    pub groups: usize,
    /// Of those, groups without an incident label (everything unlabelled lands in one).
    pub unlabelled_groups: usize,
    /// (right, judged): symptom alerts whose top-1 root cause is the labelled cause.
    pub root_cause: Option<(usize, usize)>,
}

#[derive(Debug, Clone)]
pub struct ScenarioScore {
    pub name: String,
    pub hours: f64,
    pub faults: Vec<FaultScore>,
    pub incidents: Vec<IncidentScore>,
    pub false_alerts: Vec<SeenAlert>,
    pub load: String,
    pub failed_polls: u64,
}

impl ScenarioScore {
    pub fn false_per_hour(&self) -> f64 {
        self.false_alerts.len() as f64 / self.hours.max(1e-9)
    }

    pub fn caught(&self) -> usize {
        self.faults.iter().filter(|f| f.caught).count()
    }
}

fn matches(a: &SeenAlert, f: &RanFault, tail_ms: i64) -> bool {
    let end = if f.end_ms > 0 {
        f.end_ms
    } else {
        i64::MAX - tail_ms
    };
    a.model() == Some(f.fault.model.as_str())
        && a.instance().is_none_or(|i| i == f.fault.instance)
        && a.fired_at_ms >= f.start_ms
        && a.fired_at_ms <= end + tail_ms
}

fn mentions(a: &SeenAlert, needles: &[String]) -> bool {
    needles
        .iter()
        .any(|n| a.rule.contains(n.as_str()) || a.detector.contains(n.as_str()))
}

pub fn score(o: &Outcome) -> ScenarioScore {
    let tail_ms = o.scenario.tail_s as i64 * 1000;
    let alerts: Vec<&SeenAlert> = o.observed.alerts.values().collect();
    // Each alert belongs to the earliest fault it matches, or to none (a false alert).
    let owner: Vec<Option<usize>> = alerts
        .iter()
        .map(|a| o.faults.iter().position(|f| matches(a, f, tail_ms)))
        .collect();
    let mut faults = Vec::new();
    for f in &o.faults {
        let mut mine: Vec<&SeenAlert> = alerts
            .iter()
            .copied()
            .filter(|a| matches(a, f, tail_ms))
            .collect();
        mine.sort_by_key(|a| a.fired_at_ms);
        let strict: Vec<&SeenAlert> = mine
            .iter()
            .copied()
            .filter(|a| a.instance() == Some(f.fault.instance.as_str()))
            .collect();
        let first = strict.first().or(mine.first()).map(|a| {
            let s = |t: i64| (t - f.start_ms) as f64 / 1000.0;
            (a.rule.clone(), s(a.fired_at_ms), s(a.active_at_ms).max(0.0))
        });
        faults.push(FaultScore {
            label: f
                .fault
                .specs
                .first()
                .map(|s| s.split(':').next().unwrap_or(s).to_string())
                .unwrap_or_default(),
            spec: f.spec.clone(),
            model: f.fault.model.clone(),
            instance: f.fault.instance.clone(),
            expected: f.fault.expected.clone(),
            caught: !strict.is_empty(),
            model_only: strict.is_empty() && !mine.is_empty(),
            first,
            by: mine.iter().map(|a| a.rule.clone()).collect(),
            expected_hit: mine.iter().any(|a| mentions(a, &f.fault.expected)),
            paged_s: strict
                .iter()
                .find(|a| a.severity == "critical")
                .map(|a| (a.fired_at_ms - f.start_ms) as f64 / 1000.0),
            bound_s: {
                let end = if f.end_ms > 0 { f.end_ms } else { o.end_ms };
                let peers = o.peers.get(&f.fault.instance).cloned().unwrap_or_default();
                truth::bound_s(
                    &o.truth,
                    &f.fault.instance,
                    &peers,
                    f.start_ms,
                    end,
                    o.scrape_s,
                ) + o.scrape_s
            },
            replica_rps: {
                let end = if f.end_ms > 0 { f.end_ms } else { o.end_ms };
                truth::served_per_s(&o.truth, &f.fault.instance, f.start_ms, end)
            },
        });
    }
    let mut incidents = Vec::new();
    let numbers: BTreeSet<usize> = o.faults.iter().map(|f| f.fault.incident).collect();
    for n in numbers {
        let members: Vec<usize> = (0..o.faults.len())
            .filter(|i| o.faults[*i].fault.incident == n)
            .collect();
        let mine: Vec<&SeenAlert> = alerts
            .iter()
            .zip(&owner)
            .filter(|(_, w)| w.is_some_and(|w| members.contains(&w)))
            .map(|(a, _)| *a)
            .collect();
        let groups: BTreeSet<&String> = mine
            .iter()
            .filter_map(|a| o.observed.groups_of.get(&a.id))
            .flatten()
            .collect();
        let cause = members
            .iter()
            .find_map(|i| o.faults[*i].fault.root_cause.clone());
        let root_cause = cause.map(|c| {
            let symptoms: Vec<&&SeenAlert> = mine
                .iter()
                .filter(|a| !mentions(a, std::slice::from_ref(&c)))
                .collect();
            let right = symptoms
                .iter()
                .filter(|a| {
                    a.root_cause
                        .as_ref()
                        .is_some_and(|(d, _)| d.contains(c.as_str()))
                })
                .count();
            (right, symptoms.len())
        });
        incidents.push(IncidentScore {
            alerts: mine.len(),
            groups: groups.len(),
            unlabelled_groups: groups.iter().filter(|g| !g.contains("incident")).count(),
            root_cause,
        });
    }
    let mut false_alerts: Vec<SeenAlert> = alerts
        .iter()
        .zip(&owner)
        .filter(|(_, w)| w.is_none())
        .map(|(a, _)| (*a).clone())
        .collect();
    false_alerts.sort_by_key(|a| a.fired_at_ms);
    ScenarioScore {
        name: o.scenario.name.clone(),
        hours: (o.end_ms - o.start_ms) as f64 / 3_600_000.0,
        faults,
        incidents,
        false_alerts,
        load: o.load.clone(),
        failed_polls: o.observed.failed_polls,
    }
}

fn secs(v: f64) -> String {
    format!("{v:.1}")
}

/// The markdown report: summary per scenario, detail per fault, false alerts by rule.
pub fn markdown(scores: &[ScenarioScore]) -> String {
    let mut s = String::new();
    s.push_str("| scenario | minutes | faults caught (model + instance) | time to detect, s (− `for`) | false alerts (per hour) | AM groups per incident | top-1 root cause |\n");
    s.push_str("|---|---:|---|---|---|---|---|\n");
    let (mut hours, mut falses) = (0.0, 0usize);
    for sc in scores {
        hours += sc.hours;
        falses += sc.false_alerts.len();
        let caught = if sc.faults.is_empty() {
            "–".to_string()
        } else {
            let partial = sc.faults.iter().filter(|f| f.model_only).count();
            let extra = if partial > 0 {
                format!(" (+{partial} model only)")
            } else {
                String::new()
            };
            format!("{}/{}{extra}", sc.caught(), sc.faults.len())
        };
        let ttd: Vec<String> = sc
            .faults
            .iter()
            .map(|f| match &f.first {
                Some((_, t, p)) => format!("{} ({})", secs(*t), secs(*p)),
                None => "missed".into(),
            })
            .collect();
        let groups: Vec<String> = sc
            .incidents
            .iter()
            .map(|i| match (i.groups, i.unlabelled_groups) {
                (0, _) => "– (none delivered)".into(),
                (g, 0) => g.to_string(),
                (g, u) => format!("{g} ({u} without incident_id)"),
            })
            .collect();
        let rc: Vec<String> = sc
            .incidents
            .iter()
            .filter_map(|i| i.root_cause)
            .map(|(r, n)| {
                if n == 0 {
                    "no symptom alert".into()
                } else {
                    format!("{r}/{n} right")
                }
            })
            .collect();
        s.push_str(&format!(
            "| {} | {:.1} | {} | {} | {} ({:.0}/h) | {} | {} |\n",
            sc.name,
            sc.hours * 60.0,
            caught,
            if ttd.is_empty() {
                "–".into()
            } else {
                ttd.join(", ")
            },
            sc.false_alerts.len(),
            sc.false_per_hour(),
            if groups.is_empty() {
                "–".into()
            } else {
                groups.join(", ")
            },
            if rc.is_empty() {
                "–".into()
            } else {
                rc.join(", ")
            },
        ));
    }
    s.push_str(&format!(
        "\nAll scenarios: {falses} false alerts in {:.1} min of traffic ({:.1}/h).\n",
        hours * 60.0,
        falses as f64 / hours.max(1e-9)
    ));
    let detail: Vec<(&str, &FaultScore)> = scores
        .iter()
        .flat_map(|sc| sc.faults.iter().map(move |f| (sc.name.as_str(), f)))
        .collect();
    if !detail.is_empty() {
        s.push_str("\n| scenario | fault | model / instance | expected | first matching alert | fired after, s | pending after, s | all matching rules |\n");
        s.push_str("|---|---|---|---|---|---:|---:|---|\n");
        for (name, f) in detail {
            let (rule, t, p) = match &f.first {
                Some((r, t, p)) => (
                    format!("{r}{}", if f.model_only { " (model only)" } else { "" }),
                    secs(*t),
                    secs(*p),
                ),
                None => ("**none**".into(), "–".into(), "–".into()),
            };
            s.push_str(&format!(
                "| {name} | `{}` | {} / {} | {}{} | {rule} | {t} | {p} | {} |\n",
                f.spec,
                f.model,
                f.instance,
                f.expected.join(", "),
                if f.expected_hit || f.first.is_none() {
                    ""
                } else {
                    " (not hit)"
                },
                f.by.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    let mut by_rule: BTreeMap<(String, String), (usize, String)> = BTreeMap::new();
    for sc in scores {
        for a in &sc.false_alerts {
            let e = by_rule
                .entry((sc.name.clone(), a.rule.clone()))
                .or_insert((0, String::new()));
            e.0 += 1;
            let who = format!(
                "{}/{}",
                a.model().unwrap_or("-"),
                a.instance().unwrap_or("*")
            );
            if !e.1.split(", ").any(|w| w == who) {
                if !e.1.is_empty() {
                    e.1.push_str(", ");
                }
                e.1.push_str(&who);
            }
        }
    }
    if !by_rule.is_empty() {
        s.push_str("\nFalse alerts by rule:\n\n| scenario | rule | count | model/instance |\n|---|---|---:|---|\n");
        for ((name, rule), (n, who)) in by_rule {
            s.push_str(&format!("| {name} | {rule} | {n} | {who} |\n"));
        }
    }
    s
}

/// One randomised run: its topology, how its fleet was drawn, and its score.
#[derive(Debug, Clone)]
pub struct RandomRun {
    pub topology: String,
    /// "2 replicas of model-a, 2 of model-b; scrape 15 s; 6.1 req/s".
    pub fleet: String,
    pub score: ScenarioScore,
}

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// The randomised runs' report: per topology a summary (faults paged naming the replica, within
/// 2× the bound, false alerts and false pages per hour, groups per incident), then every fault.
pub fn random_markdown(runs: &[RandomRun]) -> String {
    let mut s = String::new();
    s.push_str("| topology | fleet | minutes | faults paged naming the replica | within 2× bound | median page / bound | false alerts (pages) | AM groups per incident |\n");
    s.push_str("|---|---|---:|---|---|---:|---|---|\n");
    let (mut hours, mut falses, mut false_pages) = (0.0, 0usize, 0usize);
    for r in runs {
        let sc = &r.score;
        hours += sc.hours;
        falses += sc.false_alerts.len();
        let pages = sc
            .false_alerts
            .iter()
            .filter(|a| a.severity == "critical")
            .count();
        false_pages += pages;
        let paged = sc.faults.iter().filter(|f| f.paged_s.is_some()).count();
        let within = sc
            .faults
            .iter()
            .filter(|f| f.paged_s.is_some_and(|p| p <= 2.0 * f.bound_s))
            .count();
        let mut ratios: Vec<f64> = sc
            .faults
            .iter()
            .filter_map(|f| Some(f.paged_s? / f.bound_s))
            .filter(|r| r.is_finite())
            .collect();
        let groups: Vec<String> = sc.incidents.iter().map(|i| i.groups.to_string()).collect();
        s.push_str(&format!(
            "| {} | {} | {:.0} | {paged}/{} | {within}/{} | {} | {} ({pages}) | {} |\n",
            r.topology,
            r.fleet,
            sc.hours * 60.0,
            sc.faults.len(),
            sc.faults.len(),
            median(&mut ratios).map_or("–".into(), |m| format!("{m:.2}")),
            sc.false_alerts.len(),
            if groups.is_empty() {
                "–".into()
            } else {
                groups.join(", ")
            },
        ));
    }
    s.push_str(&format!(
        "\nAll runs: {falses} false alerts ({false_pages} pages) in {:.1} h of traffic.\n",
        hours
    ));
    s.push_str("\n| topology | fault | model / replica | replica req/s | bound, s | first alert naming the replica | alerted after, s | paged after, s | page / bound |\n");
    s.push_str("|---|---|---|---:|---:|---|---:|---:|---:|\n");
    for r in runs {
        for f in &r.score.faults {
            let (rule, t) = match &f.first {
                Some((rule, t, _)) if !f.model_only => (rule.clone(), secs(*t)),
                Some((rule, t, _)) => (format!("{rule} (model only)"), secs(*t)),
                None => ("**none**".into(), "–".into()),
            };
            let bound = if f.bound_s.is_finite() {
                format!("{:.0}", f.bound_s)
            } else {
                "∞".into()
            };
            let ratio = match f.paged_s {
                Some(p) if f.bound_s.is_finite() => format!("{:.2}", p / f.bound_s),
                _ => "–".into(),
            };
            s.push_str(&format!(
                "| {} | `{}` | {} / {} | {:.1} | {bound} | {rule} | {t} | {} | {ratio} |\n",
                r.topology,
                f.spec,
                f.model,
                f.instance,
                f.replica_rps,
                f.paged_s.map_or("–".into(), secs),
            ));
        }
    }
    let mut by_rule: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for r in runs {
        for a in &r.score.false_alerts {
            *by_rule
                .entry((r.topology.clone(), a.rule.clone(), a.severity.clone()))
                .or_default() += 1;
        }
    }
    if !by_rule.is_empty() {
        s.push_str("\nFalse alerts by rule:\n\n| topology | rule | severity | count |\n|---|---|---|---:|\n");
        for ((t, rule, sev), n) in by_rule {
            s.push_str(&format!("| {t} | {rule} | {sev} | {n} |\n"));
        }
    }
    s
}
