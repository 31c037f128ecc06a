// What each request cost: the price table of the configuration (`pricing`: USD per million
// tokens, per model id, with per-upstream overrides, inline or from `pricing.file`), checked
// and resolved once at start, and the pipeline stage that puts `cost_usd` on every record and
// counts the records of models the table does not price. Prices are never fetched at run time.

use crate::kernel::telemetry::{Metrics, cap_label};
use crate::sources::proxy::config::{UpstreamConfig, parse_upstream_url};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokenwatch_core::model::RequestRecord;

/// Prices are per this many tokens.
pub const TOKENS_PER_PRICE: f64 = 1_000_000.0;

/// `pricing` in the configuration.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PricingConfig {
    /// A YAML file in the same format (`models`, `upstreams`; see
    /// `deploy/pricing.example.yaml`), read at start. An entry here wins over the file's
    /// entry for the same model (and upstream).
    pub file: Option<PathBuf>,
    /// Model id (as counted, after `models.aliases`) → its prices.
    pub models: BTreeMap<String, ModelPrice>,
    /// Upstream (its `instance` label, or its `url` as written in `proxy.upstreams`) → model
    /// id → prices for requests served there, over `models`.
    pub upstreams: BTreeMap<String, BTreeMap<String, ModelPrice>>,
}

/// The content of `pricing.file`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PriceFile {
    pub models: BTreeMap<String, ModelPrice>,
    pub upstreams: BTreeMap<String, BTreeMap<String, ModelPrice>>,
}

/// One model's prices, US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    /// Prompt tokens not read from the prompt cache.
    pub input: f64,
    /// Prompt tokens read from the upstream's prompt cache; absent: `input`.
    #[serde(default)]
    pub cached_input: Option<f64>,
    /// Output tokens that are not reasoning tokens.
    pub output: f64,
    /// Reasoning (thinking) tokens, a part of the output; absent: `output`.
    #[serde(default)]
    pub reasoning: Option<f64>,
}

/// A price table entry that cannot be used: the key path and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct PricingError {
    pub path: String,
    pub message: String,
}

/// One model's rates, USD per million tokens, defaults applied.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    pub input: f64,
    pub cached_input: f64,
    pub output: f64,
    pub reasoning: f64,
}

impl Rates {
    fn of(p: &ModelPrice) -> Rates {
        Rates {
            input: p.input,
            cached_input: p.cached_input.unwrap_or(p.input),
            output: p.output,
            reasoning: p.reasoning.unwrap_or(p.output),
        }
    }

    /// What `r`'s tokens cost: cached prompt tokens at the cached rate, the rest of the prompt
    /// at the input rate, reasoning tokens at the reasoning rate, the rest of the output at the
    /// output rate. A count the record lacks counts as 0.
    pub fn cost(&self, r: &RequestRecord) -> f64 {
        let prompt = r.prompt_tokens.unwrap_or(0);
        let cached = r.cached_input_tokens.unwrap_or(0).min(prompt);
        let output = r.output_tokens.unwrap_or(0);
        let reasoning = r.reasoning_tokens.unwrap_or(0).min(output);
        // Divided once, at the end: whole prices and counts give the nearest f64 to the cost.
        ((prompt - cached) as f64 * self.input
            + cached as f64 * self.cached_input
            + (output - reasoning) as f64 * self.output
            + reasoning as f64 * self.reasoning)
            / TOKENS_PER_PRICE
    }
}

/// The price table, resolved: the file's and the inline entries merged, upstream URLs turned
/// into the instance labels records carry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriceTable {
    models: HashMap<String, Rates>,
    /// Instance label → model id → rates.
    upstreams: HashMap<String, HashMap<String, Rates>>,
}

impl PriceTable {
    /// Reads `pricing.file` (when set), checks every price and builds the table. `upstreams`:
    /// `proxy.upstreams`, to turn an upstream's URL into its instance label.
    pub fn load(
        cfg: &PricingConfig,
        upstreams: &[UpstreamConfig],
    ) -> Result<PriceTable, PricingError> {
        let mut merged = match &cfg.file {
            Some(path) => read_file(path)?,
            None => PriceFile::default(),
        };
        let file_prefix = cfg
            .file
            .as_ref()
            .map(|p| format!("pricing.file ({})", p.display()));
        if let Some(prefix) = &file_prefix {
            check_entries(prefix, &merged)?;
        }
        let inline = PriceFile {
            models: cfg.models.clone(),
            upstreams: cfg.upstreams.clone(),
        };
        check_entries("pricing", &inline)?;
        merged.models.extend(inline.models);
        for (upstream, models) in inline.upstreams {
            merged.upstreams.entry(upstream).or_default().extend(models);
        }
        let mut table = PriceTable {
            models: merged
                .models
                .iter()
                .map(|(m, p)| (m.clone(), Rates::of(p)))
                .collect(),
            upstreams: HashMap::new(),
        };
        for (upstream, models) in &merged.upstreams {
            let instance = instance_of(upstream, upstreams);
            let entry = table.upstreams.entry(instance).or_default();
            entry.extend(models.iter().map(|(m, p)| (m.clone(), Rates::of(p))));
        }
        Ok(table)
    }

    /// A table of `models` only (tests, the e2e helpers).
    pub fn of_models(models: &[(&str, ModelPrice)]) -> PriceTable {
        PriceTable {
            models: models
                .iter()
                .map(|(m, p)| (m.to_string(), Rates::of(p)))
                .collect(),
            upstreams: HashMap::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.models.is_empty() && self.upstreams.is_empty()
    }

    /// The rates of `model` served by the upstream labelled `instance`: the upstream's own
    /// entry, else the model's.
    pub fn rates(&self, instance: &str, model: &str) -> Option<&Rates> {
        self.upstreams
            .get(instance)
            .and_then(|m| m.get(model))
            .or_else(|| self.models.get(model))
    }

    /// What `r` cost; None when its model (at its upstream) has no price.
    pub fn cost(&self, r: &RequestRecord) -> Option<f64> {
        self.rates(&r.labels.instance, &r.labels.model_id)
            .map(|rates| rates.cost(r))
    }
}

/// An upstream key of the table as the instance label: the label of the `proxy.upstreams`
/// entry whose URL it is, else itself.
fn instance_of(key: &str, upstreams: &[UpstreamConfig]) -> String {
    let same_url = |u: &&UpstreamConfig| u.url.trim_end_matches('/') == key.trim_end_matches('/');
    match upstreams.iter().find(same_url) {
        Some(u) => match (&u.instance, parse_upstream_url(&u.url)) {
            (Some(label), _) => label.clone(),
            (None, Ok(url)) => url.authority.to_string(),
            (None, Err(_)) => key.to_string(),
        },
        None => key.to_string(),
    }
}

fn read_file(path: &Path) -> Result<PriceFile, PricingError> {
    let at = |message: String| PricingError {
        path: "pricing.file".into(),
        message: format!("{}: {message}", path.display()),
    };
    let text = std::fs::read_to_string(path).map_err(|e| at(format!("cannot read: {e}")))?;
    if text.trim().is_empty() {
        return Ok(PriceFile::default());
    }
    let mut key_path = String::new();
    serde_saphyr::with_deserializer_from_str(&text, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            key_path = e.path().to_string();
            e.into_inner()
        })
    })
    .map_err(|e| {
        if key_path.is_empty() || key_path == "." {
            at(e.to_string())
        } else {
            at(format!("key {key_path}: {e}"))
        }
    })
}

/// Every price finite and not negative, no empty model id or upstream.
fn check_entries(prefix: &str, entries: &PriceFile) -> Result<(), PricingError> {
    let check_models = |at: &str, models: &BTreeMap<String, ModelPrice>| {
        for (model, p) in models {
            let key = format!("{at}.{model:?}");
            if model.trim().is_empty() {
                return Err(PricingError {
                    path: key,
                    message: "a model id must not be empty".into(),
                });
            }
            for (field, value) in [
                ("input", Some(p.input)),
                ("cached_input", p.cached_input),
                ("output", Some(p.output)),
                ("reasoning", p.reasoning),
            ] {
                if let Some(v) = value
                    && !(v.is_finite() && v >= 0.0)
                {
                    return Err(PricingError {
                        path: format!("{key}.{field}"),
                        message: format!(
                            "{v} is not a price: USD per million tokens, finite, 0 or more"
                        ),
                    });
                }
            }
        }
        Ok(())
    };
    check_models(&format!("{prefix}.models"), &entries.models)?;
    for (upstream, models) in &entries.upstreams {
        let at = format!("{prefix}.upstreams.{upstream:?}");
        if upstream.trim().is_empty() {
            return Err(PricingError {
                path: at,
                message: "an upstream must not be empty".into(),
            });
        }
        check_models(&at, models)?;
    }
    Ok(())
}

/// Labels of `tokenwatch_unpriced_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UnpricedLabels {
    model: String,
}

/// The pipeline's pricing stage: `cost_usd` on every record, and the records with tokens of
/// models the table leaves out counted by model (their cost is unknown: None, summed as 0).
pub struct Pricer {
    table: Arc<PriceTable>,
    unpriced: Family<UnpricedLabels, Counter>,
    max_label_bytes: usize,
}

impl Pricer {
    pub fn new(table: Arc<PriceTable>, metrics: &Metrics) -> Pricer {
        let unpriced = Family::<UnpricedLabels, Counter>::default();
        metrics.register(
            "tokenwatch_unpriced_requests",
            "Requests with token counts whose model (at its upstream) the price table (pricing) leaves out: their cost_usd is unknown and spend counts them as 0, by model",
            unpriced.clone(),
        );
        Pricer {
            table,
            unpriced,
            max_label_bytes: metrics.max_label_bytes(),
        }
    }

    /// Puts the cost on `r` (None when unpriced; counted when it had tokens).
    pub fn price(&self, r: &mut RequestRecord) {
        r.cost_usd = self.table.cost(r);
        if r.cost_usd.is_none() && (r.prompt_tokens.is_some() || r.output_tokens.is_some()) {
            let mut model = r.labels.model_id.clone();
            cap_label(&mut model, self.max_label_bytes);
            self.unpriced.get_or_create(&UnpricedLabels { model }).inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn price(input: f64, cached: Option<f64>, output: f64, reasoning: Option<f64>) -> ModelPrice {
        ModelPrice {
            input,
            cached_input: cached,
            output,
            reasoning,
        }
    }

    fn record(model: &str, instance: &str, tokens: [Option<u64>; 4]) -> RequestRecord {
        let mut r = RequestRecord::default();
        r.labels.model_id = model.into();
        r.labels.instance = instance.into();
        [
            r.prompt_tokens,
            r.cached_input_tokens,
            r.output_tokens,
            r.reasoning_tokens,
        ] = tokens;
        r
    }

    #[test]
    fn each_kind_of_token_at_its_rate_with_the_defaults() {
        let t = PriceTable::of_models(&[
            ("full", price(2.0, Some(0.5), 8.0, Some(16.0))),
            ("plain", price(2.0, None, 8.0, None)),
        ]);
        // 1M prompt of which 400k cached, 300k output of which 100k reasoning.
        let r = record(
            "full",
            "i",
            [Some(1_000_000), Some(400_000), Some(300_000), Some(100_000)],
        );
        let expected = 0.6 * 2.0 + 0.4 * 0.5 + 0.2 * 8.0 + 0.1 * 16.0;
        assert!(
            (t.cost(&r).unwrap() - expected).abs() < 1e-12,
            "{:?}",
            t.cost(&r)
        );
        // Without cached and reasoning prices: input and output rates.
        let r = record(
            "plain",
            "i",
            [Some(1_000_000), Some(400_000), Some(300_000), Some(100_000)],
        );
        assert!((t.cost(&r).unwrap() - (2.0 + 0.3 * 8.0)).abs() < 1e-12);
        // Counts out of order (more cached than prompt) never go negative.
        let r = record("full", "i", [Some(10), Some(50), Some(0), Some(9)]);
        assert!((t.cost(&r).unwrap() - 10.0 * 0.5 / 1e6).abs() < 1e-15);
        assert_eq!(t.cost(&record("other", "i", [Some(1); 4])), None);
        assert_eq!(t.cost(&record("full", "i", [None; 4])), Some(0.0));
    }

    #[test]
    fn an_upstream_entry_wins_for_its_upstream_only_and_urls_become_labels() {
        let cfg = PricingConfig {
            models: BTreeMap::from([("m".to_string(), price(1.0, None, 1.0, None))]),
            upstreams: BTreeMap::from([
                (
                    "http://10.0.0.5:8000/".to_string(),
                    BTreeMap::from([("m".to_string(), price(3.0, None, 3.0, None))]),
                ),
                (
                    "gpu-b".to_string(),
                    BTreeMap::from([("m".to_string(), price(5.0, None, 5.0, None))]),
                ),
            ]),
            file: None,
        };
        let ups: Vec<UpstreamConfig> = serde_json::from_str(
            r#"[{"url":"http://10.0.0.5:8000"},{"url":"http://10.0.0.6:8000","instance":"gpu-b"}]"#,
        )
        .unwrap();
        let t = PriceTable::load(&cfg, &ups).unwrap();
        let cost = |instance| t.cost(&record("m", instance, [Some(1_000_000), None, None, None]));
        assert_eq!(cost("10.0.0.5:8000"), Some(3.0));
        assert_eq!(cost("gpu-b"), Some(5.0));
        assert_eq!(cost("elsewhere"), Some(1.0));
    }

    #[test]
    fn the_file_is_read_and_inline_entries_win() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prices.yaml");
        std::fs::write(
            &path,
            "models:\n  a: {input: 1, output: 2}\n  b: {input: 3, output: 4, cached_input: 0.5}\n",
        )
        .unwrap();
        let cfg = PricingConfig {
            file: Some(path.clone()),
            models: BTreeMap::from([("b".to_string(), price(7.0, None, 7.0, None))]),
            upstreams: BTreeMap::new(),
        };
        let t = PriceTable::load(&cfg, &[]).unwrap();
        assert_eq!(t.rates("x", "a").map(|r| r.output), Some(2.0));
        assert_eq!(t.rates("x", "b").map(|r| r.cached_input), Some(7.0));

        std::fs::write(&path, "models:\n  a: {input: 1, outptu: 2}\n").unwrap();
        let e = PriceTable::load(&cfg, &[]).unwrap_err();
        assert_eq!(e.path, "pricing.file");
        assert!(
            e.message.contains("models.a") && e.message.contains("outptu"),
            "{e}"
        );
        std::fs::write(&path, "models:\n  a: {input: -1, output: 2}\n").unwrap();
        let e = PriceTable::load(&cfg, &[]).unwrap_err();
        assert!(e.path.ends_with(".models.\"a\".input"), "{e}");
        let missing = PricingConfig {
            file: Some(dir.path().join("absent.yaml")),
            ..Default::default()
        };
        assert!(
            PriceTable::load(&missing, &[])
                .unwrap_err()
                .message
                .contains("cannot read")
        );
    }

    #[test]
    fn the_shipped_sample_loads() {
        let cfg = PricingConfig {
            file: Some(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/pricing.example.yaml"),
            ),
            ..Default::default()
        };
        let t = PriceTable::load(&cfg, &[]).unwrap();
        let gpt = t.rates("any", "gpt-4o").unwrap();
        assert_eq!(
            (gpt.input, gpt.cached_input, gpt.output, gpt.reasoning),
            (2.5, 1.25, 10.0, 10.0)
        );
        let llama = "meta-llama/Llama-3.1-8B-Instruct";
        assert_eq!(t.rates("gpu-h100-pool", llama).map(|r| r.input), Some(0.08));
        assert_eq!(t.rates("elsewhere", llama).map(|r| r.input), Some(0.05));
    }

    #[test]
    fn bad_prices_are_refused_by_key_path() {
        for (bad, field) in [
            (price(f64::NAN, None, 1.0, None), "input"),
            (price(1.0, Some(-0.1), 1.0, None), "cached_input"),
            (price(1.0, None, f64::INFINITY, None), "output"),
            (price(1.0, None, 1.0, Some(-2.0)), "reasoning"),
        ] {
            let cfg = PricingConfig {
                upstreams: BTreeMap::from([(
                    "u".to_string(),
                    BTreeMap::from([("m".to_string(), bad)]),
                )]),
                ..Default::default()
            };
            let e = PriceTable::load(&cfg, &[]).unwrap_err();
            assert_eq!(e.path, format!("pricing.upstreams.\"u\".\"m\".{field}"));
        }
    }

    #[test]
    fn unpriced_records_with_tokens_are_counted_by_model() {
        let metrics = Metrics::new();
        let pricer = Pricer::new(
            Arc::new(PriceTable::of_models(&[("m", price(1.0, None, 1.0, None))])),
            &metrics,
        );
        let mut priced = record("m", "i", [Some(10), None, Some(10), None]);
        let mut unpriced = record("x", "i", [Some(10), None, Some(10), None]);
        let mut failed = record("x", "i", [None; 4]);
        for r in [&mut priced, &mut unpriced, &mut failed] {
            pricer.price(r);
        }
        assert_eq!(priced.cost_usd, Some(20.0 / 1e6));
        assert_eq!((unpriced.cost_usd, failed.cost_usd), (None, None));
        let text = metrics.encode();
        assert!(
            text.contains("tokenwatch_unpriced_requests_total{model=\"x\"} 1\n"),
            "{text}"
        );
        assert!(!text.contains("tokenwatch_unpriced_requests_total{model=\"m\"}"));
    }
}
