// Model ids as counted (`models` in the configuration):
// - aliases: other ids one model goes by — a response's model name, a runtime's served name, an
//   instrumented app's spelling — mapped to the one id its records, scraped series and OTLP
//   metrics carry, so that its alerts, SLOs and charts do not split. Applied where records enter
//   the pipeline and where scraped and OTLP-metric points and counts reach the signal board.
// - admission: the model id of a request comes from its body, so any client can name a new
//   model with every request. Ids no upstream lists and no alias names are admitted up to
//   `max_unlisted` at once; a further one is counted as `__other__` — in the records, the alert
//   engine, the SLOs and every series — until an admitted one falls silent for
//   `unlisted_idle_after`. Applied where records and first tokens enter the pipeline.

use crate::kernel::duration::HumanDuration;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// The id unadmitted models are counted under (the series budget's `other` value too).
pub const OTHER_MODEL: &str = crate::kernel::telemetry::OTHER;

/// `models` in the configuration.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelsConfig {
    /// The model id → the other ids it goes by (exact, case-sensitive), e.g.
    /// `meta-llama/Llama-3.1-8B-Instruct: [Llama-3.1-8B-Instruct, llama-8b]`. Records, scraped
    /// series and OTLP metrics naming an alias are counted under the id.
    pub aliases: BTreeMap<String, Vec<String>>,
    /// Most model ids counted at once that no upstream's `models` list and no alias names (any
    /// id, behind an upstream that takes any model): a further id is counted as `__other__`
    /// until one of them has had no request for `unlisted_idle_after`. Default 256.
    pub max_unlisted: usize,
    /// How long an unlisted model id stays admitted without a request. Default 1h.
    pub unlisted_idle_after: HumanDuration,
}

impl Default for ModelsConfig {
    fn default() -> Self {
        ModelsConfig {
            aliases: BTreeMap::new(),
            max_unlisted: 256,
            unlisted_idle_after: HumanDuration(Duration::from_secs(3600)),
        }
    }
}

/// The resolved aliases: alias → model id. Cheap to share (`Arc`), empty by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelAliases {
    to_id: BTreeMap<String, String>,
}

/// Shared handle to the aliases.
pub type SharedAliases = Arc<ModelAliases>;

impl ModelsConfig {
    /// The admission settings, checked. Err: (key path, message).
    pub fn validate_admission(&self) -> Result<(), (String, String)> {
        if !(1..=1 << 20).contains(&self.max_unlisted) {
            return Err((
                "models.max_unlisted".into(),
                format!("{} is out of range: 1 to 1048576", self.max_unlisted),
            ));
        }
        if self.unlisted_idle_after.0 < Duration::from_secs(1) {
            return Err((
                "models.unlisted_idle_after".into(),
                "must be at least 1s".into(),
            ));
        }
        Ok(())
    }

    /// The aliases, checked: no empty id, an alias names one model only, and is no model's id
    /// itself (no chains). Err: (key path, message).
    pub fn aliases(&self) -> Result<ModelAliases, (String, String)> {
        let mut to_id: BTreeMap<String, String> = BTreeMap::new();
        for (id, aliases) in &self.aliases {
            let key = format!("models.aliases.{id:?}");
            if id.trim().is_empty() {
                return Err((key, "a model id must not be empty".into()));
            }
            for (i, alias) in aliases.iter().enumerate() {
                let at = format!("{key}[{i}]");
                if alias.trim().is_empty() {
                    return Err((at, "an alias must not be empty".into()));
                }
                if alias == id {
                    return Err((at, format!("{alias:?} is the model's own id")));
                }
                if self.aliases.contains_key(alias) {
                    return Err((
                        at,
                        format!("{alias:?} is a model id here itself: aliases do not chain"),
                    ));
                }
                if let Some(other) = to_id.insert(alias.clone(), id.clone())
                    && other != *id
                {
                    return Err((
                        at,
                        format!("{alias:?} is already an alias of {other:?}: one alias, one model"),
                    ));
                }
            }
        }
        Ok(ModelAliases { to_id })
    }
}

impl ModelAliases {
    pub fn is_empty(&self) -> bool {
        self.to_id.is_empty()
    }

    /// The model id `id` stands for: itself unless it is an alias.
    pub fn resolve<'a>(&'a self, id: &'a str) -> &'a str {
        self.to_id.get(id).map_or(id, String::as_str)
    }

    /// Renames `id` in place when it is an alias.
    pub fn apply(&self, id: &mut String) {
        if let Some(to) = self.to_id.get(id.as_str()) {
            id.clone_from(to);
        }
    }
}

/// Which model ids are counted as themselves (see the module comment). Owned by the pipeline's
/// thread: one lookup per record.
#[derive(Debug)]
pub struct ModelAdmission {
    /// Ids counted whatever their number: listed by an upstream, or an alias's id.
    listed: HashSet<String>,
    /// Unlisted ids admitted, with the time of their last request (ms).
    admitted: HashMap<String, i64>,
    max_unlisted: usize,
    idle_ms: i64,
    /// When admitted ids were last checked for idleness (ms).
    last_sweep_ms: i64,
}

impl ModelAdmission {
    /// `listed`: the ids upstreams list (a `*` entry lists none) and the aliases' ids.
    pub fn new(cfg: &ModelsConfig, listed: impl IntoIterator<Item = String>) -> ModelAdmission {
        let mut listed: HashSet<String> = listed.into_iter().filter(|m| m != "*").collect();
        listed.extend(cfg.aliases.keys().cloned());
        listed.insert(tokenwatch_core::model::UNKNOWN_MODEL.to_string());
        ModelAdmission {
            listed,
            admitted: HashMap::new(),
            max_unlisted: cfg.max_unlisted.max(1),
            idle_ms: i64::try_from(cfg.unlisted_idle_after.0.as_millis()).unwrap_or(i64::MAX),
            last_sweep_ms: i64::MIN,
        }
    }

    /// Admits `id` as of `now_ms`, or renames it to [`OTHER_MODEL`] (returns false) when the
    /// unlisted ids already admitted fill `max_unlisted` and none of them is idle.
    pub fn admit(&mut self, id: &mut String, now_ms: i64) -> bool {
        if id == OTHER_MODEL || self.listed.contains(id.as_str()) {
            return true;
        }
        if let Some(seen) = self.admitted.get_mut(id.as_str()) {
            *seen = (*seen).max(now_ms);
            return true;
        }
        if self.admitted.len() >= self.max_unlisted {
            // Sweep at most every tenth of the idle period: one full room does not rescan the
            // admitted ids for every refused request.
            if now_ms.saturating_sub(self.last_sweep_ms) >= self.idle_ms / 10 {
                self.last_sweep_ms = now_ms;
                let idle = self.idle_ms;
                self.admitted
                    .retain(|_, seen| now_ms.saturating_sub(*seen) < idle);
            }
            if self.admitted.len() >= self.max_unlisted {
                id.clear();
                id.push_str(OTHER_MODEL);
                return false;
            }
        }
        self.admitted.insert(id.clone(), now_ms);
        true
    }

    /// Unlisted ids admitted now.
    pub fn admitted(&self) -> usize {
        self.admitted.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> Result<ModelsConfig, serde_saphyr::Error> {
        serde_saphyr::from_str(yaml)
    }

    #[test]
    fn unlisted_ids_beyond_the_room_are_other_until_one_falls_idle() {
        let cfg = config("max_unlisted: 2\nunlisted_idle_after: 10s\naliases: {qwen: [Qwen2.5]}")
            .unwrap();
        cfg.validate_admission().unwrap();
        let mut a = ModelAdmission::new(&cfg, ["listed".to_string(), "*".to_string()]);
        let admit = |a: &mut ModelAdmission, id: &str, now: i64| {
            let mut id = id.to_string();
            a.admit(&mut id, now);
            id
        };
        assert_eq!(admit(&mut a, "m1", 0), "m1");
        assert_eq!(admit(&mut a, "m2", 1_000), "m2");
        assert_eq!(admit(&mut a, "m3", 2_000), OTHER_MODEL, "the room is full");
        assert_eq!(admit(&mut a, "m1", 3_000), "m1", "admitted ids stay");
        assert_eq!(
            admit(&mut a, "listed", 3_000),
            "listed",
            "listed ids never count"
        );
        assert_eq!(
            admit(&mut a, "qwen", 3_000),
            "qwen",
            "an alias's id is listed"
        );
        assert_eq!(admit(&mut a, "*", 3_000), OTHER_MODEL, "`*` lists no model");
        assert_eq!(a.admitted(), 2);
        // m2 has been silent for 10 s at 11 s: m3 takes its place; m1 (seen at 3 s) stays.
        assert_eq!(admit(&mut a, "m3", 11_000), "m3");
        assert_eq!(admit(&mut a, "m1", 11_500), "m1");
        assert_eq!(admit(&mut a, "m2", 11_500), OTHER_MODEL);
        for (yaml, key) in [
            ("max_unlisted: 0", "models.max_unlisted"),
            ("unlisted_idle_after: 0s", "models.unlisted_idle_after"),
        ] {
            let err = config(yaml).unwrap().validate_admission().unwrap_err();
            assert_eq!(err.0, key, "{yaml}");
        }
    }

    #[test]
    fn aliases_map_to_the_one_id_and_leave_others_alone() {
        let c = config(
            "aliases:\n  meta-llama/Llama-3.1-8B-Instruct: [Llama-3.1-8B-Instruct, llama-8b]\n  qwen: [Qwen2.5]\n",
        )
        .unwrap();
        let a = c.aliases().unwrap();
        assert_eq!(
            a.resolve("Llama-3.1-8B-Instruct"),
            "meta-llama/Llama-3.1-8B-Instruct"
        );
        assert_eq!(a.resolve("llama-8b"), "meta-llama/Llama-3.1-8B-Instruct");
        assert_eq!(a.resolve("Qwen2.5"), "qwen");
        assert_eq!(a.resolve("qwen"), "qwen");
        assert_eq!(a.resolve("LLAMA-8B"), "LLAMA-8B", "exact, case-sensitive");
        let mut id = "llama-8b".to_string();
        a.apply(&mut id);
        assert_eq!(id, "meta-llama/Llama-3.1-8B-Instruct");
        let mut other = "gpt".to_string();
        a.apply(&mut other);
        assert_eq!(other, "gpt");
        assert!(ModelsConfig::default().aliases().unwrap().is_empty());
    }

    #[test]
    fn conflicting_chained_empty_and_unknown_keys_are_refused() {
        for (yaml, key, says) in [
            (
                "aliases: {a: [x], b: [x]}",
                "models.aliases.\"b\"[0]",
                "already an alias of",
            ),
            (
                "aliases: {a: [b], b: [c]}",
                "models.aliases.\"a\"[0]",
                "do not chain",
            ),
            ("aliases: {a: [a]}", "models.aliases.\"a\"[0]", "own id"),
            (
                "aliases: {a: [\"\"]}",
                "models.aliases.\"a\"[0]",
                "must not be empty",
            ),
            (
                "aliases: {\" \": [x]}",
                "models.aliases.\" \"",
                "must not be empty",
            ),
        ] {
            let (path, msg) = config(yaml).unwrap().aliases().unwrap_err();
            assert_eq!(path, key, "{yaml}");
            assert!(msg.contains(says), "{yaml}: {msg}");
        }
        // The same alias listed twice under one model is harmless.
        assert!(config("aliases: {a: [x, x]}").unwrap().aliases().is_ok());
        let e = config("alias: {a: [x]}").unwrap_err().to_string();
        assert!(e.contains("unknown field"), "{e}");
    }
}
