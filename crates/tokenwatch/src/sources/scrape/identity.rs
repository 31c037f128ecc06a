// Who a scrape target is and where it runs: its identity (instance, runtime, extra labels, URL),
// the site of its serving runtime and of the GPUs its series name (for `placement`), and the
// labels of GPU series that name their host and device.

use std::collections::BTreeMap;
use tokenwatch_core::exposition::Sample;
use tokenwatch_core::placement::Site;

/// Labels of GPU series that name the host (dcgm-exporter: `Hostname` before 4.x, then `hostname`).
pub(super) const HOST_LABELS: [&str; 2] = ["Hostname", "hostname"];
/// Labels of GPU series kept as notes of their signals: which GPU, and — dcgm-exporter's
/// Kubernetes mode — the pod, namespace and container it is assigned to.
const DEVICE_NOTE_LABELS: [&str; 6] = [
    "gpu",
    "pci_bus_id",
    "modelName",
    "pod",
    "namespace",
    "container",
];

/// Who the target is, for labelling what it yields.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetIdentity {
    /// `instance` label of the target, else its `host:port`.
    pub instance: String,
    /// Runtime from configuration; detected from metric names when absent.
    pub runtime: Option<String>,
    /// The target's extra labels (`model_id` ties model-less series such as GPUs to a model;
    /// `hostname`, `pod`, `namespace` say where it runs, for `placement`).
    pub labels: BTreeMap<String, String>,
    /// The URL it is scraped at (empty in tests that do not care).
    pub url: String,
}

/// Target labels that name its Kubernetes pod / namespace (as service discovery relabels them).
const TARGET_POD_LABELS: [&str; 3] = ["pod", "pod_name", "kubernetes_pod_name"];
const TARGET_NAMESPACE_LABELS: [&str; 2] = ["namespace", "kubernetes_namespace"];

impl TargetIdentity {
    fn label(&self, names: &[&str]) -> Option<&str> {
        names
            .iter()
            .find_map(|n| self.labels.get(*n))
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// Where the serving runtime behind this target runs: its `hostname` label, else its URL's
    /// host; its pod and namespace labels.
    pub(super) fn serving_site(&self) -> Site {
        let url_host = self
            .url
            .parse::<http::Uri>()
            .ok()
            .and_then(|u| u.host().map(|h| h.trim_matches(['[', ']']).to_string()))
            .unwrap_or_default();
        let host = self.label(&["hostname"]).unwrap_or(&url_host).to_string();
        Site::new(
            &self.url,
            &host,
            self.label(&TARGET_POD_LABELS),
            self.label(&TARGET_NAMESPACE_LABELS),
        )
    }

    /// Where a GPU of this target is: the host its series name (`Hostname`), else the target's;
    /// the pod and namespace dcgm-exporter assigns it to (Kubernetes mode).
    pub(super) fn gpu_site(&self, notes: &BTreeMap<String, String>) -> Site {
        let target = self.serving_site();
        let host = notes.get("hostname").unwrap_or(&target.host);
        Site::new(
            &self.url,
            host,
            notes.get("pod").map(String::as_str),
            notes.get("namespace").map(String::as_str),
        )
    }
}

/// The host a GPU series names (`Hostname` or `hostname`, not empty).
pub(super) fn host_of<'s>(s: &'s Sample<'_>) -> Option<&'s str> {
    HOST_LABELS
        .iter()
        .find_map(|l| s.label(l))
        .filter(|h| !h.is_empty())
}

/// Notes of a GPU series' signals: [`DEVICE_NOTE_LABELS`] that are not empty (dcgm-exporter
/// writes `pod=""` for a GPU no pod holds) and the host as `hostname`, whichever label named it.
pub(super) fn device_notes(s: &Sample<'_>) -> BTreeMap<String, String> {
    let mut notes: BTreeMap<String, String> = DEVICE_NOTE_LABELS
        .iter()
        .filter_map(|l| {
            s.label(l)
                .filter(|v| !v.is_empty())
                .map(|v| (l.to_string(), v.to_string()))
        })
        .collect();
    if let Some(h) = host_of(s) {
        notes.insert("hostname".into(), h.to_string());
    }
    notes
}
