// Version-change detection: per (model, version kind) the last WINDOW observed versions; the
// dominant version changes only when another holds most of the window, which makes a marker.

use super::{MarkerKind, MarkerSource, marker};
use std::collections::{HashMap, VecDeque};
use tokenwatch_core::model::RequestRecord;
use tokenwatch_store::MarkerRow;

/// Observations kept per (model, kind).
pub const WINDOW: usize = 50;
/// Requests a version needs before it can replace the dominant version.
pub const MIN_SEEN: usize = 5;
/// The first dominant version of a model: a version with `SWITCH_SHARE` of at least this many
/// requests, or else the majority of a full window (mixed traffic from the start).
pub const FIRST_SEEN: usize = 20;
/// Share of the window a new version needs to replace the dominant one. High enough that
/// A/B traffic (two versions live at once, even 70/30) never flips it back and forth, and
/// that a stray header never counts.
pub const SWITCH_SHARE: f64 = 0.9;
/// (model, kind) pairs tracked at most; new ones beyond are ignored.
pub const MAX_TRACKS: usize = 10_000;

#[derive(Debug, Default)]
struct Track {
    /// (version, arrival) of the newest observations, oldest first.
    window: VecDeque<(String, i64)>,
    dominant: Option<String>,
}

impl Track {
    fn count(&self, version: &str) -> usize {
        self.window.iter().filter(|(v, _)| v == version).count()
    }

    /// The most frequent version of the window and its count.
    fn leader(&self) -> Option<(&str, usize)> {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for (v, _) in &self.window {
            *counts.entry(v.as_str()).or_default() += 1;
        }
        counts
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)))
    }
}

/// Turns observed versions into markers; see the constants for the rules.
#[derive(Debug, Default)]
pub struct VersionDetector {
    tracks: HashMap<(String, MarkerKind), Track>,
}

impl VersionDetector {
    pub fn new() -> VersionDetector {
        VersionDetector::default()
    }

    /// One request of `model` seen with `version` (empty versions are ignored). Returns the
    /// marker when the dominant version changed: dated at the first request of the new version
    /// still in the window, so "before" is the old version's traffic.
    pub fn observe(
        &mut self,
        model: &str,
        kind: MarkerKind,
        version: &str,
        source: MarkerSource,
        at_unix_ms: i64,
    ) -> Option<MarkerRow> {
        if version.is_empty() {
            return None;
        }
        let key = (model.to_string(), kind);
        if !self.tracks.contains_key(&key) && self.tracks.len() >= MAX_TRACKS {
            return None;
        }
        let t = self.tracks.entry(key).or_default();
        if t.window.len() == WINDOW {
            t.window.pop_front();
        }
        t.window.push_back((version.to_string(), at_unix_ms));
        match t.dominant.clone() {
            None => {
                let (leader, n) = t.leader()?;
                let len = t.window.len();
                let clear = n >= FIRST_SEEN && n as f64 >= SWITCH_SHARE * len as f64;
                if clear || (len == WINDOW && n * 2 > len) {
                    t.dominant = Some(leader.to_string());
                }
                None
            }
            Some(current) if current == version => None,
            Some(current) => {
                let n = t.count(version);
                if n < MIN_SEEN || (n as f64) < SWITCH_SHARE * t.window.len() as f64 {
                    return None;
                }
                let since = t
                    .window
                    .iter()
                    .filter(|(v, _)| v == version)
                    .map(|(_, at)| *at)
                    .min()
                    .unwrap_or(at_unix_ms);
                t.dominant = Some(version.to_string());
                Some(marker(
                    kind,
                    model,
                    &current,
                    version,
                    source,
                    since,
                    &format!(
                        "{} of {model} changed from {current} to {version} ({n} of the last {} requests)",
                        kind.name(),
                        t.window.len()
                    ),
                ))
            }
        }
    }

    /// The model and prompt versions of one record. A record made by the proxy (it has the
    /// proxy's span id) counts as `proxy`, any other (OTLP spans) as `otlp`.
    pub fn observe_record(&mut self, r: &RequestRecord) -> Vec<MarkerRow> {
        let source = if r.span.span_id.is_empty() {
            MarkerSource::Otlp
        } else {
            MarkerSource::Proxy
        };
        let model = &r.labels.model_id;
        let at = r.arrival_unix_ms;
        [
            (MarkerKind::ModelVersion, r.labels.model_version.as_str()),
            (MarkerKind::PromptVersion, r.prompt_version.as_str()),
        ]
        .into_iter()
        .filter_map(|(kind, v)| self.observe(model, kind, v, source, at))
        .collect()
    }

    /// Learn the current versions from stored records (oldest first) without making markers,
    /// so a restart does not forget which version was live.
    pub fn seed(&mut self, records: &[RequestRecord]) {
        for r in records {
            let _ = self.observe_record(r);
        }
    }

    /// The dominant version of (model, kind), once there is one.
    pub fn dominant(&self, model: &str, kind: MarkerKind) -> Option<&str> {
        self.tracks
            .get(&(model.to_string(), kind))
            .and_then(|t| t.dominant.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn feed(d: &mut VersionDetector, versions: impl IntoIterator<Item = String>) -> Vec<MarkerRow> {
        let mut out = Vec::new();
        for (i, v) in versions.into_iter().enumerate() {
            out.extend(d.observe(
                "m",
                MarkerKind::ModelVersion,
                &v,
                MarkerSource::Proxy,
                i as i64,
            ));
        }
        out
    }

    fn n(v: &str, k: usize) -> Vec<String> {
        vec![v.to_string(); k]
    }

    #[test]
    fn the_first_version_is_not_a_change() {
        let mut d = VersionDetector::new();
        assert!(feed(&mut d, n("v1", 200)).is_empty());
        assert_eq!(d.dominant("m", MarkerKind::ModelVersion), Some("v1"));
    }

    #[test]
    fn stray_headers_make_no_marker() {
        let mut d = VersionDetector::new();
        let mut seq = n("v1", 20);
        for _ in 0..10 {
            seq.push("v9".into());
            seq.extend(n("v1", 7));
        }
        seq.extend(n("v0", 4));
        seq.extend(n("v1", 60));
        assert!(feed(&mut d, seq).is_empty());
        assert_eq!(d.dominant("m", MarkerKind::ModelVersion), Some("v1"));
        // A stray first header does not become the first version either.
        let mut d = VersionDetector::new();
        let mut seq = vec!["v9".to_string()];
        seq.extend(n("v1", 30));
        assert!(feed(&mut d, seq).is_empty());
        assert_eq!(d.dominant("m", MarkerKind::ModelVersion), Some("v1"));
    }

    #[test]
    fn ab_traffic_makes_no_marker() {
        for (share_b, seed) in [0.5, 0.3, 0.7]
            .into_iter()
            .flat_map(|s| (1..=4).map(move |k| (s, k)))
        {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut d = VersionDetector::new();
            let seq =
                (0..20_000).map(|_| if rng.random_bool(share_b) { "b" } else { "a" }.to_string());
            let got = feed(&mut d, seq);
            assert!(
                got.is_empty(),
                "A/B with {share_b} to b (seed {seed}) made markers: {got:?}"
            );
        }
    }

    #[test]
    fn a_rollout_makes_one_marker_dated_at_the_new_version() {
        let mut d = VersionDetector::new();
        let mut seq = n("v1", 100);
        // A canary phase (10 % v2), then all traffic on v2.
        for i in 0..100 {
            seq.push(if i % 10 == 0 { "v2" } else { "v1" }.into());
        }
        let first_full_v2 = seq.len() as i64;
        seq.extend(n("v2", 300));
        let got = feed(&mut d, seq);
        assert_eq!(got.len(), 1, "{got:?}");
        let m = &got[0];
        assert_eq!(
            (
                m.kind.as_str(),
                m.model.as_str(),
                m.from_version.as_str(),
                m.to_version.as_str()
            ),
            ("model_version", "m", "v1", "v2")
        );
        assert_eq!(m.source, "proxy");
        // The first v2 request still in the window: a canary one at most 50 before full rollout.
        assert!(m.at_unix_ms <= first_full_v2 && m.at_unix_ms >= first_full_v2 - WINDOW as i64);
        assert!(m.id.starts_with("mk-"));
        assert_eq!(d.dominant("m", MarkerKind::ModelVersion), Some("v2"));
        // Rolling back is a second change.
        let back = feed(&mut d, n("v1", 60));
        assert_eq!(back.len(), 1);
        assert_eq!(
            (back[0].from_version.as_str(), back[0].to_version.as_str()),
            ("v2", "v1")
        );
    }

    #[test]
    fn records_feed_model_and_prompt_versions_separately_and_seed_makes_none() {
        let rec = |mv: &str, pv: &str, proxy: bool| {
            let mut r = RequestRecord {
                prompt_version: pv.into(),
                ..Default::default()
            };
            r.labels.model_id = "llama".into();
            r.labels.model_version = mv.into();
            if proxy {
                r.span.span_id = "00f067aa0ba902b7".into();
            }
            r
        };
        let mut d = VersionDetector::new();
        d.seed(&vec![rec("v1", "p1", true); 60]);
        assert_eq!(d.dominant("llama", MarkerKind::PromptVersion), Some("p1"));
        let mut got = Vec::new();
        for _ in 0..60 {
            got.extend(d.observe_record(&rec("v1", "p2", false)));
        }
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].kind, "prompt_version");
        assert_eq!(got[0].source, "otlp");
        assert_eq!(
            (got[0].from_version.as_str(), got[0].to_version.as_str()),
            ("p1", "p2")
        );
    }
}
