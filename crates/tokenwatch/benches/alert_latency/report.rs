// The alert-latency bench's arithmetic: when the anomalous data reached tokenwatch (first anomalous
// record / scrape, and the one completing the rule's condition), the latencies, and the report.

use std::collections::BTreeMap;
use std::fmt::Write as _;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Spike,
    Leak,
}

/// One fault instance and the moments measured for it (unix ms; `None` = never happened).
pub struct Instance {
    pub kind: Kind,
    pub model: String,
    pub gpu: String,
    /// The simulator accepted the fault.
    pub fault: i64,
    /// The first anomalous data reached tokenwatch: the first record (known at the request's
    /// end) whose TTFT alone exceeds the rule's ratio × the pre-fault P99, or the first scrape
    /// by tokenwatch showing the GPU's memory above its pre-fault maximum.
    pub first: Option<i64>,
    /// The data completing the rule's condition reached tokenwatch: the record after which the
    /// 60 s P99 exceeds 2.5 × the previous 60 s (both ≥ 50 requests), or the scrape completing
    /// five consecutive steps of ≥ 128 MiB.
    pub cond: Option<i64>,
    /// Prometheus's first scrape showing the leak (informational).
    pub prom_first: Option<i64>,
    pub tw_fired: Option<i64>,
    pub tw_seen: Option<i64>,
    pub tw_hook: Option<i64>,
    pub tw_am: Option<i64>,
    pub prom_active: Option<i64>,
    pub prom_seen: Option<i64>,
    pub prom_am: Option<i64>,
}

impl Instance {
    pub fn new(kind: Kind, model: String, gpu: String, fault: i64) -> Instance {
        Instance {
            kind,
            model,
            gpu,
            fault,
            first: None,
            cond: None,
            prom_first: None,
            tw_fired: None,
            tw_seen: None,
            tw_hook: None,
            tw_am: None,
            prom_active: None,
            prom_seen: None,
            prom_am: None,
        }
    }

    /// What the pollers key this instance by: the model (spike) or the GPU UUID (leak).
    pub fn key(&self) -> &str {
        match self.kind {
            Kind::Spike => &self.model,
            Kind::Leak => &self.gpu,
        }
    }

    /// Spike onsets from tokenwatch's own request records of the model.
    pub fn onset_from_records(
        &mut self,
        records: &[serde_json::Value],
        window_ms: i64,
        ratio: f64,
        min: usize,
    ) {
        let mut recs: Vec<(i64, f64)> = records
            .iter()
            .filter(|r| r["status"].as_u64() == Some(200) && r["error_class"].is_null())
            .filter_map(|r| {
                let at = r["arrival_unix_ms"].as_i64()? + (r["end_s"].as_f64()? * 1000.0) as i64;
                Some((at, r["first_token_s"].as_f64()?))
            })
            .collect();
        recs.sort_by_key(|r| r.0);
        let p99 = |from: i64, to: i64| {
            let mut v: Vec<f64> = recs
                .iter()
                .filter(|(t, _)| *t > from && *t <= to)
                .map(|(_, x)| *x)
                .collect();
            v.sort_by(f64::total_cmp);
            let rank = ((0.99 * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1));
            (v.len(), v.get(rank - 1).copied())
        };
        let (_, before) = p99(self.fault - window_ms, self.fault);
        let Some(before) = before else { return };
        self.first = recs
            .iter()
            .find(|(t, x)| *t > self.fault && *x > ratio * before)
            .map(|(t, _)| *t);
        self.cond = recs
            .iter()
            .filter(|(t, _)| *t > self.fault)
            .map(|(t, _)| *t)
            .find(|&t| {
                let (cn, c) = p99(t - window_ms, t);
                let (pn, p) = p99(t - 2 * window_ms, t - window_ms);
                matches!((c, p), (Some(c), Some(p)) if cn >= min && pn >= min && c > ratio * p)
            });
    }

    /// Leak onsets from the relay's logs of what each scraper was served.
    pub fn onset_from_scrapes(
        &mut self,
        tw: &[(i64, BTreeMap<String, f64>)],
        prom: &[(i64, BTreeMap<String, f64>)],
        step_mib: f64,
        consecutive: usize,
    ) {
        let series = |log: &[(i64, BTreeMap<String, f64>)]| -> Vec<(i64, f64)> {
            log.iter()
                .filter_map(|(t, m)| m.get(&self.gpu).map(|v| (*t, *v)))
                .collect()
        };
        let (tw, prom) = (series(tw), series(prom));
        let base = tw
            .iter()
            .filter(|(t, _)| *t < self.fault)
            .map(|(_, v)| *v)
            .fold(f64::MIN, f64::max);
        if base == f64::MIN {
            return;
        }
        let above = |s: &[(i64, f64)]| {
            s.iter()
                .find(|(t, v)| *t > self.fault && *v > base + 32.0)
                .map(|(t, _)| *t)
        };
        self.first = above(&tw);
        self.prom_first = above(&prom);
        self.cond = (consecutive..tw.len())
            .find(|&k| {
                tw[k].0 > self.fault
                    && (k + 1 - consecutive..=k).all(|j| tw[j].1 - tw[j - 1].1 >= step_mib)
            })
            .map(|k| tw[k].0);
    }

    /// The pipelines' firing times from the pollers and the webhook log.
    pub fn fill(
        &mut self,
        seen: &BTreeMap<(String, String), (i64, i64)>,
        hooks: &[(i64, serde_json::Value)],
    ) {
        let key = self.key().to_string();
        let get = |who: &str| seen.get(&(who.to_string(), key.clone())).copied();
        if let Some((at, fired)) = get("tw") {
            self.tw_seen = Some(at);
            self.tw_fired = Some(fired);
        }
        if let Some((at, active)) = get("prom") {
            self.prom_seen = Some(at);
            self.prom_active = Some(active);
        }
        self.tw_am = get("am_tw").map(|x| x.0);
        self.prom_am = get("am_prom").map(|x| x.0);
        let (rule, label, value) = match self.kind {
            Kind::Spike => ("bench_ttft_spike", "model_id", &self.model),
            Kind::Leak => ("bench_gpu_leak", "device_id", &self.gpu),
        };
        self.tw_hook = hooks
            .iter()
            .find(|(_, b)| {
                b["alert"]["state"] == "firing"
                    && b["alert"]["rule"] == rule
                    && b["alert"]["labels"][label].as_str() == Some(value.as_str())
            })
            .map(|(t, _)| *t);
    }
}

pub struct RunInfo {
    pub rps: f64,
    pub prom_interval: u64,
    pub load: String,
    pub rules: String,
}

fn secs(from: Option<i64>, to: Option<i64>) -> Option<f64> {
    Some((to? - from?) as f64 / 1000.0)
}

fn cell(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.2}")).unwrap_or_else(|| "—".into())
}

fn median_max(v: &[Option<f64>]) -> String {
    let mut x: Vec<f64> = v.iter().flatten().copied().collect();
    if x.is_empty() {
        return "—".into();
    }
    x.sort_by(f64::total_cmp);
    let m = if x.len() % 2 == 1 {
        x[x.len() / 2]
    } else {
        (x[x.len() / 2 - 1] + x[x.len() / 2]) / 2.0
    };
    let missing = v.len() - x.len();
    let miss = if missing > 0 {
        format!(" ({missing} never)")
    } else {
        String::new()
    };
    format!("{m:.2} / {:.2}{miss}", x[x.len() - 1])
}

fn median(v: &[Option<f64>]) -> Option<f64> {
    let mut x: Vec<f64> = v.iter().flatten().copied().collect();
    if x.is_empty() {
        return None;
    }
    x.sort_by(f64::total_cmp);
    Some(if x.len() % 2 == 1 {
        x[x.len() / 2]
    } else {
        (x[x.len() / 2 - 1] + x[x.len() / 2]) / 2.0
    })
}

/// The report: one table per scenario (a row per instance, then median / max), then ratios.
pub fn markdown(all: &[Instance], info: &RunInfo) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Run: {} requests/s per model through tokenwatch's proxy; tokenwatch scrapes every 1 s and evaluates on arriving data; \
         Prometheus scrapes and evaluates every {} s; both send to one Alertmanager (group_wait 1 s). Load average (1/5/15 min) start → end: {}.\n",
        info.rps, info.prom_interval, info.load
    );
    for (kind, title) in [
        (
            Kind::Spike,
            "Latency spike (`latency_spike:factor=10,share=0.3`; rule: 60 s P99 TTFT > 2.5 × previous 60 s, ≥ 50 requests each, `for: 0s`)",
        ),
        (
            Kind::Leak,
            "GPU memory leak (`kv_leak:blocks=24`, 48 MiB per finished request; rule: 5 consecutive samples each ≥ 128 MiB higher, `for: 0s`)",
        ),
    ] {
        let rows: Vec<&Instance> = all.iter().filter(|i| i.kind == kind).collect();
        let _ = writeln!(out, "#### {title}\n");
        let _ = writeln!(
            out,
            "| instance | fault → first anomalous data at tokenwatch (s) | first data → condition complete (s) | condition → tokenwatch firing (s) | first data → tokenwatch firing | → tokenwatch webhook | → Alertmanager (tokenwatch) | first data → Prometheus firing | → Alertmanager (Prometheus) | ratio Prometheus / tokenwatch at Alertmanager |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        let col =
            |f: &dyn Fn(&Instance) -> Option<f64>| rows.iter().map(|i| f(i)).collect::<Vec<_>>();
        let cols: Vec<Vec<Option<f64>>> = vec![
            col(&|i| secs(Some(i.fault), i.first)),
            col(&|i| secs(i.first, i.cond)),
            col(&|i| secs(i.cond, i.tw_fired)),
            col(&|i| secs(i.first, i.tw_fired)),
            col(&|i| secs(i.first, i.tw_hook)),
            col(&|i| secs(i.first, i.tw_am)),
            col(&|i| secs(i.first, i.prom_active)),
            col(&|i| secs(i.first, i.prom_am)),
            col(&|i| Some(secs(i.first, i.prom_am)? / secs(i.first, i.tw_am)?.max(0.001))),
        ];
        for (r, inst) in rows.iter().enumerate() {
            let cells: Vec<String> = cols.iter().map(|c| cell(c[r])).collect();
            let _ = writeln!(out, "| {} | {} |", inst.model, cells.join(" | "));
        }
        let summary: Vec<String> = cols.iter().map(|c| median_max(c)).collect();
        let _ = writeln!(out, "| **median / max** | {} |", summary.join(" | "));
        let (tw, prom) = (median(&cols[5]), median(&cols[7]));
        if let (Some(t), Some(p)) = (tw, prom) {
            let _ = writeln!(
                out,
                "\nMedian first anomalous data → Alertmanager: tokenwatch {t:.2} s, Prometheus {p:.2} s (×{:.1}).",
                p / t.max(0.001)
            );
        }
        if kind == Kind::Leak {
            let prom_first = rows
                .iter()
                .map(|i| secs(i.first, i.prom_first))
                .collect::<Vec<_>>();
            let _ = writeln!(
                out,
                "Prometheus's first scrape showing the leak came {} s (median / max) after tokenwatch's.",
                median_max(&prom_first)
            );
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(
        out,
        "<details><summary>Prometheus rules (from <code>tokenwatch rules export</code>)</summary>\n\n```yaml\n{}```\n</details>",
        info.rules
    );
    out
}
