// GPU XID errors read from dcgm-exporter: what the well-known codes mean (NVIDIA's XID catalogue)
// and the per-target tracker that turns a new error in the scrapes into a `gpu_xid_error` event.

use super::identity::{TargetIdentity, device_notes, host_of};
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use tokenwatch_core::alert::AnomalyEvent;
use tokenwatch_core::exposition::{MetricFamily, Sample};
use tokenwatch_core::signals::names;
pub use tokenwatch_detect::rootcause::GPU_XID_ERROR;

/// The last XID code of a GPU (gauge; 0 until the first error). A change to another non-zero
/// code is a new error; the same code again cannot be told from the old one.
pub const LAST_CODE_METRIC: &str = "DCGM_FI_DEV_XID_ERRORS";
/// XID errors per GPU and code within the exporter's `--xid-count-window-size` (a gauge: it falls
/// as errors leave the window, and a code's series goes away with its last error).
pub const COUNT_METRIC: &str = "DCGM_EXP_XID_ERRORS_COUNT";
/// XID errors per GPU and code since the exporter started (a counter).
pub const TOTAL_METRIC: &str = "DCGM_EXP_XID_ERRORS_TOTAL";
/// Labels naming the code on the count series: dcgm-exporter writes `xid`; `err_code` (with
/// `err_msg`) is what its documentation has shown.
const CODE_LABELS: [&str; 2] = ["xid", "err_code"];
/// Device labels of a GPU series, in the order the mapping tries them.
const DEVICE_LABELS: [&str; 3] = ["UUID", "gpu_uuid", "gpu"];

/// What a code means and what NVIDIA's XID catalogue says to do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidInfo {
    pub meaning: &'static str,
    /// The GPU must be reset (or the node rebooted) before it serves again.
    pub needs_reset: bool,
}

/// The meaning of the well-known codes (NVIDIA XID catalogue); None for the others.
pub fn describe(code: u32) -> Option<XidInfo> {
    let (meaning, needs_reset) = match code {
        13 => ("graphics engine exception", false),
        31 => ("GPU memory page fault", false),
        43 => ("GPU stopped processing", false),
        45 => ("preemptive cleanup after a previous error", false),
        48 => ("double-bit ECC error", true),
        63 => ("ECC page retirement or row remapping recorded", false),
        64 => (
            "ECC page retirement or row remapping recording failed",
            true,
        ),
        74 => ("NVLink error", true),
        79 => ("GPU has fallen off the bus", true),
        92 => ("high single-bit ECC error rate", false),
        94 => ("contained ECC error", false),
        95 => ("uncontained ECC error", true),
        119 => ("GSP RPC timeout", true),
        120 => ("GSP error", true),
        154 => ("GPU recovery action changed", true),
        _ => return None,
    };
    Some(XidInfo {
        meaning,
        needs_reset,
    })
}

fn action(info: Option<XidInfo>) -> &'static str {
    match info {
        Some(i) if i.needs_reset => "reset the GPU or reboot the node",
        Some(_) => "restart the application; reset the GPU if the error comes back",
        None => "see NVIDIA's XID catalogue",
    }
}

/// A code read from a sample value or label: a whole number, not negative.
fn code_of(v: f64) -> Option<u32> {
    (v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v <= f64::from(u32::MAX)).then_some(v as u32)
}

/// The GPU a series is about: its device id, MIG instance and host.
fn device_key(s: &Sample<'_>) -> String {
    let dev = DEVICE_LABELS.iter().find_map(|l| s.label(l)).unwrap_or("");
    let mig = s.label("GPU_I_ID").unwrap_or("");
    format!("{dev}\u{1f}{mig}\u{1f}{}", host_of(s).unwrap_or(""))
}

/// One new error of one GPU found in a scrape (the gauge and a count may both show it).
struct Found {
    labels: BTreeMap<String, String>,
    notes: BTreeMap<String, String>,
    device_id: String,
    reported_by: Vec<&'static str>,
    previous_code: Option<u32>,
    new_errors: f64,
    err_msg: Option<String>,
}

/// Per-target state: the last code and the counts each GPU showed in the previous scrape.
#[derive(Debug, Default)]
pub struct XidTracker {
    last: HashMap<String, u32>,
    counts: HashMap<(String, &'static str, u32), f64>,
    /// GPUs seen before: what a GPU's first scrape shows is history, not a new error.
    devices: HashSet<String>,
}

impl XidTracker {
    /// The new XID errors in this scrape, as `gpu_xid_error` events at `now_ms`.
    pub fn observe(
        &mut self,
        families: &[MetricFamily<'_>],
        target: &TargetIdentity,
        now_ms: i64,
    ) -> Vec<AnomalyEvent> {
        let mut found: BTreeMap<(String, u32), Found> = BTreeMap::new();
        let mut counts: HashMap<(String, &'static str, u32), f64> = HashMap::new();
        let mut seen: HashSet<String> = HashSet::new();
        for fam in families {
            for s in &fam.samples {
                let metric = match s.name {
                    LAST_CODE_METRIC => LAST_CODE_METRIC,
                    COUNT_METRIC => COUNT_METRIC,
                    TOTAL_METRIC => TOTAL_METRIC,
                    _ => continue,
                };
                let key = device_key(s);
                let known = self.devices.contains(&key);
                seen.insert(key.clone());
                if metric == LAST_CODE_METRIC {
                    let Some(code) = code_of(s.value) else {
                        continue;
                    };
                    let previous = self.last.insert(key.clone(), code);
                    if code != 0 && known && previous != Some(code) {
                        let f = found
                            .entry((key, code))
                            .or_insert_with(|| Found::new(s, target));
                        f.reported_by.push(metric);
                        f.previous_code = previous;
                        f.new_errors = f.new_errors.max(1.0);
                    }
                    continue;
                }
                let Some(code) = CODE_LABELS
                    .iter()
                    .find_map(|l| s.label(l))
                    .and_then(|c| c.trim().parse::<u32>().ok())
                    .filter(|c| *c != 0)
                else {
                    continue;
                };
                if !s.value.is_finite() {
                    continue;
                }
                let ckey = (key.clone(), metric, code);
                let increase = match self.counts.get(&ckey) {
                    Some(prev) => s.value - prev,
                    // A code's series appearing on a GPU seen before: errors since then.
                    None if known => s.value,
                    None => 0.0,
                };
                counts.insert(ckey, s.value);
                if increase > 0.0 {
                    let f = found
                        .entry((key, code))
                        .or_insert_with(|| Found::new(s, target));
                    f.reported_by.push(metric);
                    f.new_errors = f.new_errors.max(increase);
                    if f.err_msg.is_none() {
                        f.err_msg = s
                            .label("err_msg")
                            .filter(|m| !m.is_empty())
                            .map(str::to_string);
                    }
                }
            }
        }
        self.counts = counts;
        self.devices.extend(seen);
        found
            .into_iter()
            .map(|((_, code), f)| f.into_event(code, now_ms))
            .collect()
    }
}

impl Found {
    fn new(s: &Sample<'_>, target: &TargetIdentity) -> Found {
        let notes = device_notes(s);
        let device_id = DEVICE_LABELS
            .iter()
            .find_map(|l| s.label(l))
            .unwrap_or("")
            .to_string();
        // The instance as the GPU's signals name it: the target's label, the host, host:port.
        let instance = target
            .labels
            .get("instance")
            .cloned()
            .or_else(|| host_of(s).map(str::to_string))
            .unwrap_or_else(|| target.instance.clone());
        let mut labels = BTreeMap::from([
            ("instance".to_string(), instance),
            ("device_id".to_string(), device_id.clone()),
        ]);
        for l in ["gpu", "pod", "namespace", "container"] {
            if let Some(v) = notes.get(l) {
                labels.insert(l.to_string(), v.clone());
            }
        }
        if let Some(m) = target.labels.get("model_id") {
            labels.insert("model_id".into(), m.clone());
        }
        Found {
            labels,
            notes,
            device_id,
            reported_by: Vec::new(),
            previous_code: None,
            new_errors: 0.0,
            err_msg: None,
        }
    }

    fn into_event(mut self, code: u32, now_ms: i64) -> AnomalyEvent {
        let info = describe(code);
        let meaning = info
            .map(|i| i.meaning.to_string())
            .or_else(|| self.err_msg.clone())
            .unwrap_or_else(|| "unknown code".into());
        let todo = action(info);
        self.labels.insert("xid".into(), code.to_string());
        let gpu = match self.notes.get("gpu") {
            Some(g) => format!("GPU {g} ({})", self.device_id),
            None => format!("GPU {}", self.device_id),
        };
        let mut summary = format!(
            "{gpu} on {} reported XID {code} ({meaning}): {todo}",
            self.labels["instance"]
        );
        if let Some(pod) = self.notes.get("pod") {
            let ns = self
                .notes
                .get("namespace")
                .map(|n| format!("{n}/"))
                .unwrap_or_default();
            summary.push_str(&format!("; pod {ns}{pod} holds it"));
        }
        let mut evidence = BTreeMap::from([
            ("xid".to_string(), json!(code)),
            ("meaning".to_string(), json!(meaning)),
            ("action".to_string(), json!(todo)),
            ("reported_by".to_string(), json!(self.reported_by)),
            ("new_errors".to_string(), json!(self.new_errors)),
        ]);
        if let Some(p) = self.previous_code {
            evidence.insert("previous_code".into(), json!(p));
        }
        if let Some(m) = &self.err_msg {
            evidence.insert("err_msg".into(), json!(m));
        }
        if !self.notes.is_empty() {
            evidence.insert("gpu".into(), json!(self.notes));
        }
        AnomalyEvent {
            detector: GPU_XID_ERROR.into(),
            signal: names::GPU_XID_LAST_CODE.into(),
            labels: self.labels,
            // 1 at the threshold (any XID); codes that take the GPU out of service count double.
            score: if info.is_some_and(|i| i.needs_reset) {
                2.0
            } else {
                1.0
            },
            at_unix_ms: now_ms,
            evidence,
            summary,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenwatch_core::exposition::{Format, parse};

    const GPU: &str = r#"gpu="0",UUID="GPU-5b4e",pci_bus_id="00000000:00:07.0",device="nvidia0",modelName="NVIDIA L40S",Hostname="gpu1""#;

    fn target() -> TargetIdentity {
        TargetIdentity {
            instance: "127.0.0.1:9400".into(),
            runtime: None,
            labels: BTreeMap::new(),
            url: String::new(),
        }
    }

    fn scrape(t: &mut XidTracker, text: &str, at: i64) -> Vec<AnomalyEvent> {
        let fams = parse(text, Format::PrometheusText).expect("exposition");
        t.observe(&fams, &target(), at)
    }

    fn last(code: u32, extra: &str) -> String {
        format!(
            "# TYPE DCGM_FI_DEV_XID_ERRORS gauge\nDCGM_FI_DEV_XID_ERRORS{{{GPU}{extra}}} {code}\n"
        )
    }

    #[test]
    fn a_new_last_code_is_an_error_and_the_first_scrape_is_history() {
        let mut t = XidTracker::default();
        assert!(scrape(&mut t, &last(43, ""), 1).is_empty(), "history");
        assert!(scrape(&mut t, &last(43, ""), 2).is_empty(), "unchanged");
        let e = scrape(&mut t, &last(79, ""), 3);
        assert_eq!(e.len(), 1);
        let e = &e[0];
        assert_eq!(
            (e.detector.as_str(), e.signal.as_str(), e.at_unix_ms),
            (GPU_XID_ERROR, names::GPU_XID_LAST_CODE, 3)
        );
        assert_eq!(
            e.labels,
            BTreeMap::from(
                [
                    ("instance", "gpu1"),
                    ("device_id", "GPU-5b4e"),
                    ("gpu", "0"),
                    ("xid", "79")
                ]
                .map(|(k, v)| (k.to_string(), v.to_string()))
            )
        );
        assert_eq!(e.evidence["xid"], json!(79));
        assert_eq!(e.evidence["meaning"], json!("GPU has fallen off the bus"));
        assert_eq!(e.evidence["previous_code"], json!(43));
        assert_eq!(e.evidence["reported_by"], json!([LAST_CODE_METRIC]));
        assert_eq!(e.score, 2.0);
        assert!(
            e.summary.contains("XID 79 (GPU has fallen off the bus)")
                && e.summary.contains("reset the GPU"),
            "{}",
            e.summary
        );
        // Back to 0 (driver reloaded) is no error; a code after it is.
        assert!(scrape(&mut t, &last(0, ""), 4).is_empty());
        let e = scrape(&mut t, &last(13, ""), 5);
        assert_eq!(e[0].evidence["meaning"], json!("graphics engine exception"));
        assert_eq!(e[0].score, 1.0);
        assert!(e[0].summary.contains("restart the application"));
    }

    #[test]
    fn kubernetes_labels_name_the_pod_and_empty_ones_are_dropped() {
        let mut t = XidTracker::default();
        let pod = r#",container="vllm",namespace="serving",pod="vllm-0""#;
        scrape(&mut t, &last(0, pod), 1);
        let e = scrape(&mut t, &last(48, pod), 2);
        let l = &e[0].labels;
        assert_eq!(
            (
                l["pod"].as_str(),
                l["namespace"].as_str(),
                l["container"].as_str()
            ),
            ("vllm-0", "serving", "vllm")
        );
        assert!(
            e[0].summary.contains("pod serving/vllm-0"),
            "{}",
            e[0].summary
        );
        assert_eq!(e[0].evidence["meaning"], json!("double-bit ECC error"));
        let empty = r#",container="",namespace="",pod="""#;
        let mut t = XidTracker::default();
        scrape(&mut t, &last(0, empty), 1);
        let e = scrape(&mut t, &last(94, empty), 2);
        assert!(
            !e[0].labels.contains_key("pod") && !e[0].labels.contains_key("namespace"),
            "{:?}",
            e[0].labels
        );
    }

    fn count(metric: &str, series: &[(&str, f64)]) -> String {
        let mut s = format!("# TYPE {metric} gauge\n");
        for (labels, v) in series {
            s.push_str(&format!("{metric}{{{GPU}{labels}}} {v}\n"));
        }
        s
    }

    #[test]
    fn count_series_grow_per_code() {
        let mut t = XidTracker::default();
        // The window count: a zero series without a code until there is an error.
        assert!(scrape(&mut t, &count(COUNT_METRIC, &[("", 0.0)]), 1).is_empty());
        let e = scrape(
            &mut t,
            &count(
                COUNT_METRIC,
                &[(r#",xid="31""#, 2.0), (r#",xid="74""#, 1.0)],
            ),
            2,
        );
        let codes: Vec<(&str, f64)> = e
            .iter()
            .map(|e| {
                (
                    e.labels["xid"].as_str(),
                    e.evidence["new_errors"].as_f64().unwrap(),
                )
            })
            .collect();
        assert_eq!(codes, [("31", 2.0), ("74", 1.0)]);
        // Unchanged, then falling as errors leave the window: nothing new.
        assert!(scrape(&mut t, &count(COUNT_METRIC, &[(r#",xid="31""#, 2.0)]), 3).is_empty());
        assert!(scrape(&mut t, &count(COUNT_METRIC, &[(r#",xid="31""#, 1.0)]), 4).is_empty());
        assert_eq!(
            scrape(&mut t, &count(COUNT_METRIC, &[(r#",xid="31""#, 2.0)]), 5).len(),
            1
        );
        // The documented label names: err_code with err_msg, on the total counter.
        let e = scrape(
            &mut t,
            &count(
                TOTAL_METRIC,
                &[(r#",err_code="140",err_msg="Unrecovered ECC Error""#, 1.0)],
            ),
            6,
        );
        assert_eq!(e[0].labels["xid"], "140");
        assert_eq!(e[0].evidence["meaning"], json!("Unrecovered ECC Error"));
        assert_eq!(e[0].evidence["err_msg"], json!("Unrecovered ECC Error"));
        assert!(e[0].summary.contains("see NVIDIA's XID catalogue"));
    }

    #[test]
    fn gauge_and_count_of_one_error_make_one_event() {
        let mut t = XidTracker::default();
        let first = format!("{}{}", last(0, ""), count(COUNT_METRIC, &[("", 0.0)]));
        scrape(&mut t, &first, 1);
        let both = format!(
            "{}{}",
            last(95, ""),
            count(COUNT_METRIC, &[(r#",xid="95""#, 1.0)])
        );
        let e = scrape(&mut t, &both, 2);
        assert_eq!(e.len(), 1, "{e:#?}");
        assert_eq!(
            e[0].evidence["reported_by"],
            json!([LAST_CODE_METRIC, COUNT_METRIC])
        );
        // A target label ties the GPU to a model and names the instance.
        let mut t = XidTracker::default();
        let tgt = TargetIdentity {
            labels: BTreeMap::from([
                ("model_id".to_string(), "llama".to_string()),
                ("instance".to_string(), "node-7".to_string()),
            ]),
            ..target()
        };
        let (before, after) = (last(0, ""), last(119, ""));
        let fams = parse(&before, Format::PrometheusText).unwrap();
        t.observe(&fams, &tgt, 1);
        let fams = parse(&after, Format::PrometheusText).unwrap();
        let e = t.observe(&fams, &tgt, 2);
        assert_eq!(
            (
                e[0].labels["model_id"].as_str(),
                e[0].labels["instance"].as_str()
            ),
            ("llama", "node-7")
        );
    }

    #[test]
    fn bad_values_and_codes_are_ignored() {
        let mut t = XidTracker::default();
        scrape(&mut t, &last(0, ""), 1);
        for v in ["NaN", "-1", "1.5", "+Inf"] {
            let text = format!("DCGM_FI_DEV_XID_ERRORS{{{GPU}}} {v}\n");
            assert!(scrape(&mut t, &text, 2).is_empty(), "{v}");
        }
        let text = count(COUNT_METRIC, &[(r#",xid="abc""#, 3.0)]);
        assert!(scrape(&mut t, &text, 3).is_empty());
        assert!(describe(79).is_some_and(|i| i.needs_reset));
        assert_eq!(describe(1), None);
    }
}
