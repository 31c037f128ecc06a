// Placement: which serving instance (and so which model) each GPU works for — the device →
// instance → model mapping that makes a GPU's alert and its replica's symptoms one incident, and
// lets a GPU alert name the replica it hurts. Learned from what the scrapes see:
// - a GPU and a serving runtime read from one endpoint (the same scrape target) share a place;
// - else dcgm-exporter's Kubernetes labels (`pod`, `namespace`) against the serving target's;
// - else the GPU's host (dcgm-exporter's `Hostname`, else its target's `hostname` label or URL
//   host) against the serving target's host (its `hostname` label, else its URL host).
// A model the GPU's own target names (`model_id` on the dcgm target) narrows the match.

use std::collections::{BTreeMap, BTreeSet};

/// Label a GPU's events get when placement names the one serving instance it works for.
pub const SERVING_INSTANCE_LABEL: &str = "serving_instance";

/// Where a scrape target runs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Site {
    /// The scrape target's URL.
    pub target: String,
    /// Host name or address (lower-cased; empty when unknown).
    pub host: String,
    /// Kubernetes pod and namespace, when the series or the target name them.
    pub pod: Option<String>,
    pub namespace: Option<String>,
}

impl Site {
    pub fn new(target: &str, host: &str, pod: Option<&str>, namespace: Option<&str>) -> Site {
        let some = |v: Option<&str>| v.map(str::trim).filter(|v| !v.is_empty()).map(String::from);
        Site {
            target: target.to_string(),
            host: host.trim().to_ascii_lowercase(),
            pod: some(pod),
            namespace: some(namespace),
        }
    }
}

/// One place seen in a scrape: a serving (model, instance) when `device_id` is empty, else a GPU
/// (`instance` is then the GPU's host label as the signals carry it; `model_id` may be empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub model_id: String,
    pub instance: String,
    pub device_id: String,
    pub site: Site,
}

/// A serving instance a GPU works for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Served {
    pub model_id: String,
    pub instance: String,
}

#[derive(Debug, Clone)]
struct Entry {
    model_id: String,
    site: Site,
    seen_ms: i64,
}

/// Serving instances and GPUs seen recently, each with its site. Bounded: past `max_entries`
/// of a kind, new places are not learned (the ones known keep being refreshed).
#[derive(Debug)]
pub struct Placement {
    /// (model, instance) → site.
    serving: BTreeMap<(String, String), Entry>,
    /// (GPU instance, device) → site and the model its target names.
    gpus: BTreeMap<(String, String), Entry>,
    max_entries: usize,
}

impl Default for Placement {
    fn default() -> Self {
        Placement::new(20_000)
    }
}

impl Placement {
    pub fn new(max_entries: usize) -> Placement {
        Placement {
            serving: BTreeMap::new(),
            gpus: BTreeMap::new(),
            max_entries,
        }
    }

    /// Remember (or refresh) one place seen at `now_ms`.
    pub fn observe(&mut self, p: Placed, now_ms: i64) {
        let (map, key) = if p.device_id.is_empty() {
            if p.model_id.is_empty() {
                return;
            }
            (&mut self.serving, (p.model_id.clone(), p.instance))
        } else {
            (&mut self.gpus, (p.instance, p.device_id))
        };
        if map.len() >= self.max_entries && !map.contains_key(&key) {
            return;
        }
        map.insert(
            key,
            Entry {
                model_id: p.model_id,
                site: p.site,
                seen_ms: now_ms,
            },
        );
    }

    /// Forget places not seen for `max_age_ms`.
    pub fn evict_older_than(&mut self, now_ms: i64, max_age_ms: i64) {
        self.serving.retain(|_, e| now_ms - e.seen_ms <= max_age_ms);
        self.gpus.retain(|_, e| now_ms - e.seen_ms <= max_age_ms);
    }

    /// The serving instances GPU `device` (of host label `instance`) works for: those read from
    /// the same target, else those in its pod, else those on its host; a model the GPU's target
    /// names narrows them. Empty when the GPU or its place is unknown.
    pub fn served_by(&self, instance: &str, device: &str) -> Vec<Served> {
        let Some(gpu) = self.gpus.get(&(instance.to_string(), device.to_string())) else {
            return Vec::new();
        };
        let candidates = || {
            self.serving
                .iter()
                .filter(|((m, _), _)| gpu.model_id.is_empty() || *m == gpu.model_id)
        };
        let same_target: Vec<_> = candidates()
            .filter(|(_, s)| s.site.target == gpu.site.target)
            .collect();
        let same_pod = || -> Vec<_> {
            let Some(pod) = &gpu.site.pod else {
                return Vec::new();
            };
            candidates()
                .filter(|(_, s)| {
                    s.site.pod.as_ref() == Some(pod)
                        && match (&s.site.namespace, &gpu.site.namespace) {
                            (Some(a), Some(b)) => a == b,
                            _ => true,
                        }
                })
                .collect()
        };
        let same_host = || -> Vec<_> {
            if gpu.site.host.is_empty() {
                return Vec::new();
            }
            candidates()
                .filter(|(_, s)| s.site.host == gpu.site.host)
                .collect()
        };
        let found = if !same_target.is_empty() {
            same_target
        } else {
            let by_pod = same_pod();
            if by_pod.is_empty() {
                same_host()
            } else {
                by_pod
            }
        };
        found
            .into_iter()
            .map(|((m, i), _)| Served {
                model_id: m.clone(),
                instance: i.clone(),
            })
            .collect()
    }

    /// Labels of a GPU's event (`instance` + `device_id`) completed from its placement: the model
    /// (`model_id`) when every instance it works for serves one model and the event names none,
    /// and that instance (`serving_instance`) when it is one. Other events are left as they are.
    pub fn complete_labels(&self, labels: &mut BTreeMap<String, String>) {
        let (Some(instance), Some(device)) = (labels.get("instance"), labels.get("device_id"))
        else {
            return;
        };
        if device.is_empty() {
            return;
        }
        let served = self.served_by(instance, device);
        if served.is_empty() {
            return;
        }
        let models: BTreeSet<&str> = served.iter().map(|s| s.model_id.as_str()).collect();
        let model_named = labels.get("model_id").filter(|m| !m.is_empty()).cloned();
        if model_named.is_none() && models.len() == 1 {
            labels.insert("model_id".into(), served[0].model_id.clone());
        }
        let model = labels.get("model_id").cloned();
        let of_model: Vec<&Served> = served
            .iter()
            .filter(|s| model.as_ref().is_none_or(|m| *m == s.model_id))
            .collect();
        if let [one] = of_model.as_slice() {
            labels.insert(SERVING_INSTANCE_LABEL.into(), one.instance.clone());
        }
    }

    pub fn len(&self) -> usize {
        self.serving.len() + self.gpus.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serving(model: &str, instance: &str, site: Site) -> Placed {
        Placed {
            model_id: model.into(),
            instance: instance.into(),
            device_id: String::new(),
            site,
        }
    }

    fn gpu(model: &str, host_label: &str, device: &str, site: Site) -> Placed {
        Placed {
            model_id: model.into(),
            instance: host_label.into(),
            device_id: device.into(),
            site,
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn served(p: &Placement, instance: &str, device: &str) -> Vec<(String, String)> {
        p.served_by(instance, device)
            .into_iter()
            .map(|s| (s.model_id, s.instance))
            .collect()
    }

    #[test]
    fn one_endpoint_serving_and_gpu_share_a_place() {
        let mut p = Placement::default();
        let t = "http://10.0.0.5:8000/metrics";
        p.observe(
            serving(
                "llama",
                "10.0.0.5:8000",
                Site::new(t, "10.0.0.5", None, None),
            ),
            0,
        );
        p.observe(
            gpu("", "sim-0", "GPU-1", Site::new(t, "sim-0", None, None)),
            0,
        );
        // Another replica on another target, same host name by accident: the target wins.
        let t2 = "http://10.0.0.6:8000/metrics";
        p.observe(
            serving("llama", "10.0.0.6:8000", Site::new(t2, "sim-0", None, None)),
            0,
        );
        assert_eq!(
            served(&p, "sim-0", "GPU-1"),
            vec![("llama".into(), "10.0.0.5:8000".into())]
        );
        let mut l = labels(&[("instance", "sim-0"), ("device_id", "GPU-1")]);
        p.complete_labels(&mut l);
        assert_eq!(l["model_id"], "llama");
        assert_eq!(l[SERVING_INSTANCE_LABEL], "10.0.0.5:8000");
    }

    #[test]
    fn dcgm_kubernetes_pods_join_the_serving_targets_pod() {
        let mut p = Placement::default();
        let dcgm = "http://10.1.0.2:9400/metrics";
        for (pod, ip, dev) in [
            ("vllm-a-7f", "10.2.0.11", "GPU-a"),
            ("vllm-b-9c", "10.2.0.12", "GPU-b"),
        ] {
            let t = format!("http://{ip}:8000/metrics");
            p.observe(
                serving(
                    "llama",
                    &format!("{ip}:8000"),
                    Site::new(&t, ip, Some(pod), Some("serving")),
                ),
                0,
            );
            p.observe(
                gpu(
                    "",
                    "node-1",
                    dev,
                    Site::new(dcgm, "node-1", Some(pod), Some("serving")),
                ),
                0,
            );
        }
        assert_eq!(
            served(&p, "node-1", "GPU-b"),
            vec![("llama".into(), "10.2.0.12:8000".into())]
        );
        // A pod of the same name in another namespace is another pod.
        p.observe(
            gpu(
                "",
                "node-1",
                "GPU-c",
                Site::new(dcgm, "node-1", Some("vllm-a-7f"), Some("other")),
            ),
            0,
        );
        assert!(served(&p, "node-1", "GPU-c").is_empty());
    }

    #[test]
    fn hosts_join_when_nothing_closer_is_known_and_a_named_model_narrows() {
        let mut p = Placement::default();
        let dcgm = "http://gpu-node-3:9400/metrics";
        for (model, port) in [("llama", 8000), ("qwen", 8001)] {
            let t = format!("http://gpu-node-3:{port}/metrics");
            p.observe(
                serving(
                    model,
                    &format!("gpu-node-3:{port}"),
                    Site::new(&t, "GPU-Node-3", None, None),
                ),
                0,
            );
        }
        p.observe(
            gpu(
                "",
                "gpu-node-3",
                "GPU-0",
                Site::new(dcgm, "gpu-node-3", None, None),
            ),
            0,
        );
        assert_eq!(served(&p, "gpu-node-3", "GPU-0").len(), 2);
        // Two models on the host: neither label is guessed.
        let mut l = labels(&[("instance", "gpu-node-3"), ("device_id", "GPU-0")]);
        p.complete_labels(&mut l);
        assert_eq!(l.len(), 2, "{l:?}");
        // The event names its model (configured on the dcgm target): its replica follows.
        let mut l = labels(&[
            ("instance", "gpu-node-3"),
            ("device_id", "GPU-0"),
            ("model_id", "qwen"),
        ]);
        p.complete_labels(&mut l);
        assert_eq!(l[SERVING_INSTANCE_LABEL], "gpu-node-3:8001");
        p.observe(
            gpu(
                "qwen",
                "gpu-node-3",
                "GPU-1",
                Site::new(dcgm, "gpu-node-3", None, None),
            ),
            0,
        );
        assert_eq!(
            served(&p, "gpu-node-3", "GPU-1"),
            vec![("qwen".into(), "gpu-node-3:8001".into())]
        );
        // Unknown GPUs, and events that are not a GPU's, stay as they are.
        let mut l = labels(&[("instance", "elsewhere"), ("device_id", "GPU-9")]);
        p.complete_labels(&mut l);
        assert_eq!(l.len(), 2);
        let mut l = labels(&[("instance", "gpu-node-3:8000"), ("model_id", "llama")]);
        p.complete_labels(&mut l);
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn places_expire_and_the_map_is_bounded() {
        let mut p = Placement::new(2);
        let site = Site::new("http://h:1/metrics", "h", None, None);
        for (i, m) in ["a", "b", "c"].iter().enumerate() {
            p.observe(serving(m, "h:1", site.clone()), i as i64 * 1000);
        }
        assert_eq!(p.len(), 2, "the third serving place is refused");
        p.observe(serving("a", "h:1", site.clone()), 5_000);
        p.evict_older_than(5_000, 2_000);
        assert_eq!(p.len(), 1);
        p.observe(serving("", "h:1", site), 5_000);
        assert_eq!(p.len(), 1, "a serving place without a model is not one");
    }
}
