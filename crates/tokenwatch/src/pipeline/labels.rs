// What a record's identity fields may hold once they leave the pipeline: label values and
// request ids come from callers (the request body's model, a tenant header, `x-request-id`; the
// response's model name from the upstream, which may echo the request's), so
// personal data in them is masked like other received free text (`capture.mask.telemetry`), and
// a request id a caller reuses cannot make two records one (the second becomes `<id>~<8 hex>`;
// annotations, captured text and scores hang on the id) — while the same record received again
// (a retried OTLP export or posted batch: same id, trace, arrival and model) is kept once. Runs on the pipeline thread, where
// every source's records pass (proxy, replicas' shipped records, OTLP, posted records), before
// aliases and admission, so /metrics, the store and the detectors only ever see the result.

use crate::capture::mask::Masker;
use crate::kernel::telemetry::Metrics;
use prometheus_client::metrics::counter::Counter;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use tokenwatch_core::model::{FirstToken, RequestRecord};

/// Request ids remembered by default: a reuse within this many records is caught (~1.5 MB).
/// Beyond it a lookup by id answers the oldest record (the first writer keeps its id).
pub const DEFAULT_RECENT_IDS: usize = 65_536;

/// The longest caller-chosen request id kept before a reuse suffix is added (`~` + 8 hex makes
/// 128, the proxy's bound on `x-request-id`).
const MAX_REUSED_PREFIX: usize = 119;

pub struct RecordIdentity {
    /// `capture.mask.telemetry`: label values and request ids masked; None: kept as sent.
    masker: Option<Arc<Masker>>,
    recent: RecentIds,
    masked: Counter,
    reused: Counter,
    repeated: Counter,
}

impl RecordIdentity {
    pub fn new(masker: Option<Arc<Masker>>, recent_ids: usize, metrics: &Metrics) -> Self {
        let masked = Counter::default();
        let reused = Counter::default();
        let repeated = Counter::default();
        metrics.register(
            "tokenwatch_record_labels_masked",
            "Label values and request ids of records (model, response model, tenant, A/B group, model and prompt version, request id) in which personal data was masked (capture.mask.telemetry)",
            masked.clone(),
        );
        metrics.register(
            "tokenwatch_request_ids_reused",
            "Records whose request id an earlier record already had: stored as <id>~<8 hex> so that the first keeps its id",
            reused.clone(),
        );
        metrics.register(
            "tokenwatch_records_repeated",
            "Records received again (same request id, trace, arrival and model as one among the recent: a retried export or batch) and kept once",
            repeated.clone(),
        );
        RecordIdentity {
            masker,
            recent: RecentIds::new(recent_ids),
            masked,
            reused,
            repeated,
        }
    }

    /// Masks the record's labels and request id, then makes its id unique among the recent;
    /// false when the record is one already received (drop it).
    pub fn settle(&mut self, record: &mut RequestRecord) -> bool {
        if let Some(m) = &self.masker {
            let labels = &mut record.labels;
            let n = [
                &mut record.request_id,
                &mut labels.model_id,
                &mut labels.tenant,
                &mut labels.ab_group,
                &mut labels.model_version,
                &mut record.prompt_version,
                &mut record.span.response_model,
            ]
            .into_iter()
            .map(|v| mask_in_place(m, v))
            .filter(|&masked| masked)
            .count();
            self.masked.inc_by(n as u64);
        }
        if record.request_id.is_empty() {
            return true;
        }
        let fingerprint = self.recent.fingerprint(record);
        match self.recent.insert(&record.request_id, fingerprint) {
            Seen::New => {}
            Seen::Same => {
                self.repeated.inc();
                return false;
            }
            Seen::Other => {
                self.reused.inc();
                record.request_id = reissued(&record.request_id);
                self.recent.insert(&record.request_id, fingerprint);
            }
        }
        true
    }

    /// A first token's model and request id, masked as its record's will be (the early copy
    /// and the record meet by request id).
    pub fn settle_first(&mut self, first: &mut FirstToken) {
        if let Some(m) = &self.masker {
            let n = [&mut first.request_id, &mut first.model_id]
                .into_iter()
                .map(|v| mask_in_place(m, v))
                .filter(|&masked| masked)
                .count();
            self.masked.inc_by(n as u64);
        }
    }
}

/// Masks `value` in place; whether anything was masked.
fn mask_in_place(masker: &Masker, value: &mut String) -> bool {
    match masker.mask_free_text(value) {
        Some(masked) => {
            *value = masked;
            true
        }
        None => false,
    }
}

/// `id` cut to `MAX_REUSED_PREFIX` bytes (on a character boundary) with `~` and 8 random hex.
fn reissued(id: &str) -> String {
    let mut end = id.len().min(MAX_REUSED_PREFIX);
    while !id.is_char_boundary(end) {
        end -= 1;
    }
    let tag: u32 = rand::random();
    format!("{}~{tag:08x}", &id[..end])
}

/// Whether a request id was among the recent.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    New,
    /// With the same record (fingerprint).
    Same,
    /// With another record.
    Other,
}

/// The last `capacity` request ids with their record's fingerprint, as 64-bit hashes (randomly
/// keyed, so ids cannot be chosen to collide), oldest forgotten first.
struct RecentIds {
    capacity: usize,
    hasher: std::collections::hash_map::RandomState,
    ids: HashMap<u64, u64>,
    order: VecDeque<u64>,
}

impl RecentIds {
    fn new(capacity: usize) -> RecentIds {
        RecentIds {
            capacity,
            hasher: Default::default(),
            ids: HashMap::with_capacity(capacity.min(DEFAULT_RECENT_IDS)),
            order: VecDeque::with_capacity(capacity.min(DEFAULT_RECENT_IDS)),
        }
    }

    fn hash(&self, parts: &[&[u8]]) -> u64 {
        let mut h = self.hasher.build_hasher();
        for p in parts {
            h.write(p);
            h.write_u8(0xff);
        }
        h.finish()
    }

    /// What makes a record the same one received again: trace, arrival and model.
    fn fingerprint(&self, r: &RequestRecord) -> u64 {
        self.hash(&[
            r.trace_id.as_bytes(),
            &r.arrival_unix_ms.to_le_bytes(),
            r.labels.model_id.as_bytes(),
        ])
    }

    /// Remembers `id` with `fingerprint` unless it is remembered already.
    fn insert(&mut self, id: &str, fingerprint: u64) -> Seen {
        if self.capacity == 0 {
            return Seen::New;
        }
        let key = self.hash(&[id.as_bytes()]);
        if let Some(&seen) = self.ids.get(&key) {
            return if seen == fingerprint {
                Seen::Same
            } else {
                Seen::Other
            };
        }
        self.ids.insert(key, fingerprint);
        self.order.push_back(key);
        if self.order.len() > self.capacity
            && let Some(old) = self.order.pop_front()
        {
            self.ids.remove(&old);
        }
        Seen::New
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::mask::MaskConfig;

    fn identity(mask: bool, recent: usize) -> (RecordIdentity, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let masker = mask.then(|| Arc::new(Masker::new(&MaskConfig::default(), b"k").unwrap()));
        (RecordIdentity::new(masker, recent, &metrics), metrics)
    }

    fn record(id: &str, model: &str, tenant: &str) -> RequestRecord {
        let mut r = RequestRecord {
            request_id: id.into(),
            trace_id: format!("trace-of-{tenant}"),
            ..Default::default()
        };
        r.labels.model_id = model.into();
        r.labels.tenant = tenant.into();
        r
    }

    #[test]
    fn personal_data_in_labels_and_ids_is_masked_the_same_way_each_time() {
        let (mut ids, metrics) = identity(true, 16);
        let mut a = record("req-judy@example.com", "llama 10.1.2.3", "judy@example.com");
        a.labels.ab_group = "+1 415 555 0100".into();
        ids.settle(&mut a);
        assert!(!a.request_id.contains("judy"), "{}", a.request_id);
        // `req-judy@example.com` is itself an address: the whole id is its token.
        assert!(a.request_id.starts_with("[email:"), "{}", a.request_id);
        assert!(
            !a.labels.model_id.contains("10.1.2.3"),
            "{}",
            a.labels.model_id
        );
        assert!(
            a.labels.tenant.starts_with("[email:"),
            "{}",
            a.labels.tenant
        );
        assert!(!a.labels.ab_group.contains("555"), "{}", a.labels.ab_group);
        // The same person is the same tenant (keyed tokens), the first token meets its record.
        let mut b = record("other", "llama-3-8b", "judy@example.com");
        ids.settle(&mut b);
        assert_eq!(a.labels.tenant, b.labels.tenant);
        assert_eq!(b.labels.model_id, "llama-3-8b");
        let mut first = FirstToken {
            request_id: "req-judy@example.com".into(),
            model_id: "llama 10.1.2.3".into(),
            ..Default::default()
        };
        ids.settle_first(&mut first);
        assert_eq!(first.request_id, a.request_id);
        assert_eq!(first.model_id, a.labels.model_id);
        // a: id, model, tenant, A/B group; b: tenant; the first token: id, model.
        let text = metrics.encode();
        assert!(
            text.contains("tokenwatch_record_labels_masked_total 7"),
            "{text}"
        );
    }

    #[test]
    fn labels_are_kept_as_sent_when_masking_is_off() {
        let (mut ids, _) = identity(false, 16);
        let mut a = record("judy@example.com", "m", "judy@example.com");
        ids.settle(&mut a);
        assert_eq!(a.request_id, "judy@example.com");
        assert_eq!(a.labels.tenant, "judy@example.com");
    }

    #[test]
    fn a_reused_request_id_gets_a_suffix_and_the_first_keeps_it() {
        let (mut ids, metrics) = identity(false, 4);
        let mut first = record("abc", "m", "t1");
        let mut second = record("abc", "m", "t2");
        let mut third = record("abc", "m", "t2");
        assert!(ids.settle(&mut first) && ids.settle(&mut second) && ids.settle(&mut third));
        assert_eq!(first.request_id, "abc");
        assert!(
            second.request_id.starts_with("abc~"),
            "{}",
            second.request_id
        );
        assert_eq!(second.request_id.len(), "abc~".len() + 8);
        assert_ne!(second.request_id, third.request_id);
        assert!(
            metrics
                .encode()
                .contains("tokenwatch_request_ids_reused_total 2")
        );
        // A long id stays within the proxy's 128 bytes, cut on a character boundary.
        let long = format!("{}é{}", "x".repeat(118), "y".repeat(9));
        let mut a = record(&long, "m", "t");
        let mut b = record(&long, "m", "u");
        ids.settle(&mut a);
        ids.settle(&mut b);
        assert_eq!(a.request_id, long);
        assert!(b.request_id.len() <= 128, "{}", b.request_id.len());
        assert!(b.request_id.starts_with(&"x".repeat(118)));
    }

    #[test]
    fn the_same_record_received_again_is_kept_once() {
        let (mut ids, metrics) = identity(false, 4);
        let mut first = record("span-1", "m", "t1");
        let mut again = first.clone();
        assert!(ids.settle(&mut first));
        assert!(!ids.settle(&mut again), "a retried export is dropped");
        // The same id with another arrival is another record.
        let mut later = RequestRecord {
            arrival_unix_ms: 5,
            ..record("span-1", "m", "t1")
        };
        assert!(ids.settle(&mut later));
        assert!(later.request_id.starts_with("span-1~"));
        let text = metrics.encode();
        assert!(
            text.contains("tokenwatch_records_repeated_total 1"),
            "{text}"
        );
        assert!(
            text.contains("tokenwatch_request_ids_reused_total 1"),
            "{text}"
        );
    }

    #[test]
    fn ids_are_forgotten_oldest_first_beyond_the_bound() {
        let mut recent = RecentIds::new(3);
        for id in ["a", "b", "c", "d"] {
            assert_eq!(recent.insert(id, 1), Seen::New);
        }
        assert_eq!(recent.insert("a", 2), Seen::New, "the oldest was forgotten");
        assert_eq!(recent.insert("d", 1), Seen::Same);
        assert_eq!(recent.insert("d", 2), Seen::Other);
        assert!(recent.ids.len() <= 3 && recent.order.len() <= 3);
        let mut off = RecentIds::new(0);
        assert_eq!(off.insert("a", 1), Seen::New);
        assert_eq!(off.insert("a", 1), Seen::New);
    }
}
