// Version markers from scraped runtime metrics: the model version a target reports (a
// `model_version` label, Triton's per-model `version`) changing makes a `scrape` marker.

use crate::kernel::markers::{MarkerKind, MarkerSource, marker};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use tokenwatch_core::exposition::Sample;
use tokenwatch_store::{MarkerRow, Store};

/// Consecutive scrapes a new version must be the only one reported before it replaces the
/// live one (a flapping label or a half-finished rollout makes no marker).
pub const CONFIRM_SCRAPES: u32 = 2;
/// (target, model) pairs tracked at most; new ones beyond are ignored.
pub const MAX_TRACKED: usize = 10_000;
/// Labels naming a model on a series that carries a version.
const MODEL_LABELS: [&str; 3] = ["model_id", "model_name", "model"];

/// The model version one sample reports, with its model: a `model_version` label on any
/// family, or Triton's `version` label on its `nv_*` families.
pub fn version_of<'a>(family: &str, s: &'a Sample<'_>) -> Option<(&'a str, &'a str)> {
    let version = s
        .label("model_version")
        .or_else(|| {
            family
                .starts_with("nv_")
                .then(|| s.label("version"))
                .flatten()
        })
        .filter(|v| !v.is_empty())?;
    let model = MODEL_LABELS
        .iter()
        .find_map(|l| s.label(l))
        .filter(|m| !m.is_empty())?;
    Some((model, version))
}

/// Collects one scrape's (model, version) pairs; a model reported with two versions in one
/// scrape (both loaded during a rollout) is ambiguous and left out.
#[derive(Debug, Default)]
pub struct ScrapeVersions {
    seen: BTreeMap<String, Option<String>>,
}

impl ScrapeVersions {
    pub fn add(&mut self, model: &str, version: &str) {
        match self.seen.get_mut(model) {
            None => {
                self.seen
                    .insert(model.to_string(), Some(version.to_string()));
            }
            Some(slot) => {
                if slot.as_deref() != Some(version) {
                    *slot = None;
                }
            }
        }
    }

    /// The unambiguous (model, version) pairs.
    pub fn finish(self) -> Vec<(String, String)> {
        self.seen
            .into_iter()
            .filter_map(|(m, v)| Some((m, v?)))
            .collect()
    }
}

#[derive(Debug)]
struct Live {
    version: String,
    /// A different version and how many consecutive scrapes reported it.
    candidate: Option<(String, u32, i64)>,
}

/// Live version per (target instance, model). The first version seen is learnt without a
/// marker (after a start too: a change while tokenwatch was down is not dated).
#[derive(Debug, Default)]
pub struct VersionTracker {
    live: HashMap<(String, String), Live>,
}

impl VersionTracker {
    /// One scrape of `instance` reported `version` for `model` at `at_unix_ms`; the marker
    /// when the version changed, dated at the first scrape of the new version.
    pub fn observe(
        &mut self,
        instance: &str,
        model: &str,
        version: &str,
        at_unix_ms: i64,
    ) -> Option<MarkerRow> {
        let key = (instance.to_string(), model.to_string());
        if !self.live.contains_key(&key) {
            if self.live.len() >= MAX_TRACKED {
                return None;
            }
            self.live.insert(
                key,
                Live {
                    version: version.to_string(),
                    candidate: None,
                },
            );
            return None;
        }
        let live = self.live.get_mut(&key)?;
        if live.version == version {
            live.candidate = None;
            return None;
        }
        let (n, since) = match &live.candidate {
            Some((v, n, since)) if v == version => (n + 1, *since),
            _ => (1, at_unix_ms),
        };
        if n < CONFIRM_SCRAPES {
            live.candidate = Some((version.to_string(), n, since));
            return None;
        }
        let from = std::mem::replace(&mut live.version, version.to_string());
        live.candidate = None;
        Some(marker(
            MarkerKind::ModelVersion,
            model,
            &from,
            version,
            MarkerSource::Scrape,
            since,
            &format!(
                "model_version of {model} changed from {from} to {version} (reported by {instance})"
            ),
        ))
    }
}

/// The tracker shared by every scrape target, writing its markers to the store.
#[derive(Clone)]
pub struct ScrapedMarkers {
    tracker: Arc<Mutex<VersionTracker>>,
    store: Arc<dyn Store>,
}

impl ScrapedMarkers {
    pub fn new(store: Arc<dyn Store>) -> ScrapedMarkers {
        ScrapedMarkers {
            tracker: Arc::new(Mutex::new(VersionTracker::default())),
            store,
        }
    }

    /// One scrape's versions of `instance`; markers are stored off the async threads.
    pub fn observe(&self, instance: &str, versions: &[(String, String)], at_unix_ms: i64) {
        if versions.is_empty() {
            return;
        }
        let found: Vec<MarkerRow> = {
            let mut t = self.tracker.lock().unwrap_or_else(|p| p.into_inner());
            versions
                .iter()
                .filter_map(|(m, v)| t.observe(instance, m, v, at_unix_ms))
                .collect()
        };
        if found.is_empty() {
            return;
        }
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || match store.insert_markers(&found) {
            Ok(()) => {
                for m in &found {
                    tracing::info!(id = %m.id, model = %m.model, from = %m.from_version,
                        to = %m.to_version, "version marker from a scraped model_version");
                }
            }
            Err(e) => {
                tracing::error!(error = %e, markers = found.len(), "scraped version markers not stored")
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenwatch_core::exposition::{Format, parse};

    #[test]
    fn versions_come_from_model_version_labels_and_triton_versions() {
        let text = "# TYPE vllm:cache_config_info gauge\n\
            vllm:cache_config_info{model_name=\"a\",model_version=\"v2\"} 1\n\
            # TYPE nv_inference_count counter\n\
            nv_inference_count{model=\"b\",version=\"3\"} 7\n\
            # TYPE other_info gauge\n\
            other_info{model=\"c\",version=\"9\"} 1\n\
            other_info{model_version=\"v1\"} 1\n";
        let fams = parse(text, Format::PrometheusText).unwrap();
        let mut got = Vec::new();
        for f in &fams {
            for s in &f.samples {
                if let Some((m, v)) = version_of(f.name, s) {
                    got.push((m.to_string(), v.to_string()));
                }
            }
        }
        assert_eq!(
            got,
            [
                ("a".to_string(), "v2".to_string()),
                ("b".to_string(), "3".to_string())
            ],
            "a bare `version` counts on Triton only; a version without a model is ignored"
        );
    }

    #[test]
    fn two_versions_in_one_scrape_are_ambiguous() {
        let mut s = ScrapeVersions::default();
        s.add("a", "1");
        s.add("a", "1");
        s.add("b", "1");
        s.add("b", "2");
        s.add("b", "1");
        assert_eq!(s.finish(), [("a".to_string(), "1".to_string())]);
    }

    #[test]
    fn a_confirmed_change_makes_one_marker_dated_at_its_first_scrape() {
        let mut t = VersionTracker::default();
        assert!(
            t.observe("i", "m", "v1", 0).is_none(),
            "the first version is learnt"
        );
        assert!(t.observe("i", "m", "v1", 1000).is_none());
        // A one-scrape blip is no change.
        assert!(t.observe("i", "m", "v2", 2000).is_none());
        assert!(t.observe("i", "m", "v1", 3000).is_none());
        assert!(t.observe("i", "m", "v2", 4000).is_none());
        let m = t.observe("i", "m", "v2", 5000).expect("confirmed");
        assert_eq!(
            (
                m.kind.as_str(),
                m.model.as_str(),
                m.from_version.as_str(),
                m.to_version.as_str()
            ),
            ("model_version", "m", "v1", "v2")
        );
        assert_eq!((m.source.as_str(), m.at_unix_ms), ("scrape", 4000));
        assert!(t.observe("i", "m", "v2", 6000).is_none(), "once");
        // Another target's first report of the model is learnt, not a change.
        assert!(t.observe("j", "m", "v1", 6000).is_none());
    }
}
