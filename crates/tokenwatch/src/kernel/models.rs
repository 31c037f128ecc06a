// Model aliases (`models.aliases` in the configuration): other ids one model goes by — a
// response's model name, a runtime's served name, an instrumented app's spelling — mapped to the
// one id its records, scraped series and OTLP metrics carry, so that its alerts, SLOs and charts
// do not split. Applied where records enter the pipeline and where scraped and OTLP-metric
// points and counts reach the signal board.

use std::collections::BTreeMap;
use std::sync::Arc;

/// `models` in the configuration.
#[derive(Debug, Clone, Default, serde::Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelsConfig {
    /// The model id → the other ids it goes by (exact, case-sensitive), e.g.
    /// `meta-llama/Llama-3.1-8B-Instruct: [Llama-3.1-8B-Instruct, llama-8b]`. Records, scraped
    /// series and OTLP metrics naming an alias are counted under the id.
    pub aliases: BTreeMap<String, Vec<String>>,
}

/// The resolved aliases: alias → model id. Cheap to share (`Arc`), empty by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelAliases {
    to_id: BTreeMap<String, String>,
}

/// Shared handle to the aliases.
pub type SharedAliases = Arc<ModelAliases>;

impl ModelsConfig {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> Result<ModelsConfig, serde_saphyr::Error> {
        serde_saphyr::from_str(yaml)
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
