// A sentence embedder of the all-MiniLM-L6-v2 kind: candle-transformers' BERT encoder read from a
// local directory, with our own tokenisation and truncation, mean pooling over the attention mask
// and L2 normalisation, as sentence-transformers.

use super::EmbedError;
use candle_core::{D, DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config, HiddenAct};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

/// Token limit when the directory has no `sentence_bert_config.json` (all-MiniLM-L6-v2's).
const DEFAULT_MAX_TOKENS: usize = 256;

/// The fields of a BERT `config.json` this embedder reads. candle's `Config` requires more
/// (`vocab_size`, `intermediate_size`, `type_vocab_size`, dropouts, …); `candle_config` fills
/// those from the weights' shapes and inference-neutral defaults, so a `config.json` with only
/// these fields loads.
#[derive(Debug, Clone, Deserialize)]
struct BertConfig {
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    layer_norm_eps: f64,
    #[serde(default = "default_act")]
    hidden_act: String,
}

fn default_eps() -> f64 {
    1e-12
}

fn default_act() -> String {
    "gelu".into()
}

#[derive(Debug, Deserialize)]
struct SentenceBertConfig {
    max_seq_length: Option<usize>,
}

fn model_error(path: &Path, message: impl std::fmt::Display) -> EmbedError {
    EmbedError::Model {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

fn compute(e: candle_core::Error) -> EmbedError {
    EmbedError::Compute(e.to_string())
}

/// The encoder and its tokenizer, loaded once; `embed` is safe to call from any one thread.
pub struct SentenceEmbedder {
    tokenizer: Tokenizer,
    model: BertModel,
    hidden: usize,
    max_tokens: usize,
}

impl SentenceEmbedder {
    /// Loads `model.safetensors`, `config.json` and `tokenizer.json` from `dir` (and the token
    /// limit from `sentence_bert_config.json` when present). Errors name the file at fault.
    pub fn load(dir: &Path) -> Result<SentenceEmbedder, EmbedError> {
        if !dir.is_dir() {
            return Err(model_error(dir, "is not a readable directory"));
        }
        let file = |name: &str| -> PathBuf { dir.join(name) };
        let config_path = file("config.json");
        let config_text =
            std::fs::read_to_string(&config_path).map_err(|e| model_error(&config_path, e))?;
        let config: BertConfig =
            serde_json::from_str(&config_text).map_err(|e| model_error(&config_path, e))?;
        if config.num_attention_heads == 0
            || !config
                .hidden_size
                .is_multiple_of(config.num_attention_heads)
        {
            return Err(model_error(
                &config_path,
                "hidden_size is not a multiple of num_attention_heads",
            ));
        }
        let hidden_act = match config.hidden_act.as_str() {
            "gelu" => HiddenAct::Gelu,
            "gelu_new" | "gelu_pytorch_tanh" => HiddenAct::GeluApproximate,
            "relu" => HiddenAct::Relu,
            other => {
                return Err(model_error(
                    &config_path,
                    format_args!(
                        "hidden_act {other:?} is not supported (gelu, gelu_new, gelu_pytorch_tanh, relu)"
                    ),
                ));
            }
        };
        let st_path = file("sentence_bert_config.json");
        let max_seq = match std::fs::read_to_string(&st_path) {
            Ok(text) => serde_json::from_str::<SentenceBertConfig>(&text)
                .map_err(|e| model_error(&st_path, e))?
                .max_seq_length
                .unwrap_or(DEFAULT_MAX_TOKENS),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => DEFAULT_MAX_TOKENS,
            Err(e) => return Err(model_error(&st_path, e)),
        };
        let max_tokens = max_seq.clamp(2, config.max_position_embeddings);

        let tok_path = file("tokenizer.json");
        let tok_bytes = std::fs::read(&tok_path).map_err(|e| model_error(&tok_path, e))?;
        let mut tokenizer =
            Tokenizer::from_bytes(&tok_bytes).map_err(|e| model_error(&tok_path, e))?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_tokens,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(|e| model_error(&tok_path, e))?;

        let weights_path = file("model.safetensors");
        let device = Device::Cpu;
        let tensors: HashMap<String, Tensor> =
            candle_core::safetensors::load(&weights_path, &device)
                .map_err(|e| model_error(&weights_path, e))?;
        // Checkpoints saved from `BertModel` have bare names; from `BertFor…`, a `bert.` prefix.
        // `BertModel::load` looks for the prefix with `contains_tensor("bert")`, which asks for a
        // tensor named exactly `bert` and so never matches; it falls back to
        // `{model_type}.embeddings` only when config.json names `model_type`. Finding the prefix
        // here loads prefixed checkpoints with or without `model_type`, as before.
        let prefix = if tensors.keys().any(|k| k.starts_with("bert.")) {
            "bert."
        } else {
            ""
        };
        let candle = candle_config(&config, hidden_act, &tensors, prefix)
            .map_err(|message| model_error(&weights_path, message))?;
        let vb = VarBuilder::from_tensors(tensors, DType::F32, &device);
        let vb = if prefix.is_empty() { vb } else { vb.pp("bert") };
        let model = BertModel::load(vb, &candle).map_err(|e| model_error(&weights_path, e))?;
        Ok(SentenceEmbedder {
            tokenizer,
            model,
            hidden: config.hidden_size,
            max_tokens,
        })
    }

    /// Dimensions of the vectors `embed` returns.
    pub fn dim(&self) -> usize {
        self.hidden
    }

    /// Most tokens of a text that are read (the rest is cut, as sentence-transformers does).
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Token ids of `text` with `[CLS]`/`[SEP]`, truncated to `max_tokens`.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| EmbedError::Compute(format!("tokenizing: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The unit-length sentence embedding of `text`.
    pub fn embed(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        let ids = self.tokenize(text)?;
        self.forward(&ids).map_err(compute)
    }

    fn forward(&self, ids: &[u32]) -> candle_core::Result<Vec<f32>> {
        // A batch of one sentence, all of token type 0.
        let ids_t = Tensor::new(ids, &Device::Cpu)?.unsqueeze(0)?;
        let types = ids_t.zeros_like()?;
        // No mask given: every token of the one unpadded sentence is attended to.
        let x = self.model.forward(&ids_t, &types, None)?.squeeze(0)?;
        // Every token is under the attention mask, so the masked mean is the mean over all tokens.
        let mean = x.mean(0)?;
        let norm = mean
            .sqr()?
            .sum_keepdim(D::Minus1)?
            .sqrt()?
            .clamp(1e-12, f32::MAX)?;
        mean.broadcast_div(&norm)?.to_vec1::<f32>()
    }
}

/// candle's `Config` from the fields we read and the weights: the vocabulary, intermediate and
/// token-type sizes are the shapes of the tensors that hold them (whatever config.json says, as
/// before); dropouts, initializer range and pad id do not enter inference and keep candle's
/// defaults. An error names the missing or malformed tensor.
fn candle_config(
    c: &BertConfig,
    hidden_act: HiddenAct,
    tensors: &HashMap<String, Tensor>,
    prefix: &str,
) -> Result<Config, String> {
    let dim = |name: &str, axis: usize| -> Result<usize, String> {
        let full = format!("{prefix}{name}");
        let t = tensors
            .get(&full)
            .ok_or_else(|| format!("has no tensor {full}"))?;
        t.dim(axis).map_err(|e| format!("tensor {full}: {e}"))
    };
    let intermediate_size = if c.num_hidden_layers == 0 {
        4 * c.hidden_size
    } else {
        dim("encoder.layer.0.intermediate.dense.weight", 0)?
    };
    Ok(Config {
        vocab_size: dim("embeddings.word_embeddings.weight", 0)?,
        hidden_size: c.hidden_size,
        num_hidden_layers: c.num_hidden_layers,
        num_attention_heads: c.num_attention_heads,
        intermediate_size,
        hidden_act,
        max_position_embeddings: c.max_position_embeddings,
        type_vocab_size: dim("embeddings.token_type_embeddings.weight", 0)?,
        layer_norm_eps: c.layer_norm_eps,
        model_type: None,
        ..Config::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HIDDEN: usize = 4;
    const INNER: usize = 8;

    /// The weights of a one-layer BERT of width 4 with deterministic values, bare names.
    fn tiny_weights() -> Vec<(String, Tensor)> {
        let shapes: &[(&str, &[usize])] = &[
            ("embeddings.word_embeddings.weight", &[6, HIDDEN]),
            ("embeddings.position_embeddings.weight", &[16, HIDDEN]),
            ("embeddings.token_type_embeddings.weight", &[2, HIDDEN]),
            ("embeddings.LayerNorm.weight", &[HIDDEN]),
            ("embeddings.LayerNorm.bias", &[HIDDEN]),
            (
                "encoder.layer.0.attention.self.query.weight",
                &[HIDDEN, HIDDEN],
            ),
            ("encoder.layer.0.attention.self.query.bias", &[HIDDEN]),
            (
                "encoder.layer.0.attention.self.key.weight",
                &[HIDDEN, HIDDEN],
            ),
            ("encoder.layer.0.attention.self.key.bias", &[HIDDEN]),
            (
                "encoder.layer.0.attention.self.value.weight",
                &[HIDDEN, HIDDEN],
            ),
            ("encoder.layer.0.attention.self.value.bias", &[HIDDEN]),
            (
                "encoder.layer.0.attention.output.dense.weight",
                &[HIDDEN, HIDDEN],
            ),
            ("encoder.layer.0.attention.output.dense.bias", &[HIDDEN]),
            (
                "encoder.layer.0.attention.output.LayerNorm.weight",
                &[HIDDEN],
            ),
            ("encoder.layer.0.attention.output.LayerNorm.bias", &[HIDDEN]),
            (
                "encoder.layer.0.intermediate.dense.weight",
                &[INNER, HIDDEN],
            ),
            ("encoder.layer.0.intermediate.dense.bias", &[INNER]),
            ("encoder.layer.0.output.dense.weight", &[HIDDEN, INNER]),
            ("encoder.layer.0.output.dense.bias", &[HIDDEN]),
            ("encoder.layer.0.output.LayerNorm.weight", &[HIDDEN]),
            ("encoder.layer.0.output.LayerNorm.bias", &[HIDDEN]),
        ];
        shapes
            .iter()
            .enumerate()
            .map(|(i, (name, shape))| {
                let n: usize = shape.iter().product();
                let t = Tensor::arange(0f32, n as f32, &Device::Cpu)
                    .unwrap()
                    .affine(0.37, i as f64)
                    .unwrap()
                    .sin()
                    .unwrap()
                    .reshape(*shape)
                    .unwrap();
                (name.to_string(), t)
            })
            .collect()
    }

    const TOKENIZER: &str = r#"{
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
        "decoder": null,
        "model": {"type": "WordLevel", "unk_token": "[UNK]",
                  "vocab": {"[UNK]": 0, "[PAD]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "world": 5}}
    }"#;

    /// Only the fields today's loader reads: candle's `Config` requires many more.
    const MINIMAL_CONFIG: &str = r#"{"hidden_size": 4, "num_hidden_layers": 1,
        "num_attention_heads": 2, "max_position_embeddings": 16}"#;

    fn model_dir(config: &str, weights: Vec<(String, Tensor)>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), config).unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), TOKENIZER).unwrap();
        let map: HashMap<String, Tensor> = weights.into_iter().collect();
        candle_core::safetensors::save(&map, dir.path().join("model.safetensors")).unwrap();
        dir
    }

    #[test]
    fn a_minimal_config_loads_and_embeds_unit_vectors() {
        let dir = model_dir(MINIMAL_CONFIG, tiny_weights());
        let model = SentenceEmbedder::load(dir.path()).unwrap();
        assert_eq!(model.dim(), HIDDEN);
        assert_eq!(model.max_tokens(), 16);
        assert_eq!(model.tokenize("hello world").unwrap(), [2, 4, 5, 3]);
        let v = model.embed("hello world").unwrap();
        assert_eq!(v.len(), HIDDEN);
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{v:?}");
        // Truncated at the position table's 16 tokens, [CLS] and [SEP] included.
        let long = "hello ".repeat(40);
        assert_eq!(model.tokenize(&long).unwrap().len(), 16);
        assert!(model.embed(&long).is_ok());
    }

    #[test]
    fn prefixed_checkpoints_with_gamma_beta_norms_give_the_same_vectors() {
        let bare = model_dir(MINIMAL_CONFIG, tiny_weights());
        let renamed = tiny_weights()
            .into_iter()
            .map(|(name, t)| {
                let name = name
                    .replace("LayerNorm.weight", "LayerNorm.gamma")
                    .replace("LayerNorm.bias", "LayerNorm.beta");
                (format!("bert.{name}"), t)
            })
            .collect();
        let prefixed = model_dir(MINIMAL_CONFIG, renamed);
        let a = SentenceEmbedder::load(bare.path()).unwrap();
        let b = SentenceEmbedder::load(prefixed.path()).unwrap();
        for text in ["hello", "hello world", "world world hello"] {
            assert_eq!(a.embed(text).unwrap(), b.embed(text).unwrap(), "{text}");
        }
    }

    #[test]
    fn loading_errors_name_the_file_and_what_is_wrong() {
        let err = |dir: &tempfile::TempDir| match SentenceEmbedder::load(dir.path()) {
            Ok(_) => panic!("loaded"),
            Err(e) => e.to_string(),
        };
        let no_heads = model_dir(
            r#"{"hidden_size": 4, "num_hidden_layers": 1, "max_position_embeddings": 16}"#,
            tiny_weights(),
        );
        let e = err(&no_heads);
        assert!(
            e.contains("config.json") && e.contains("num_attention_heads"),
            "{e}"
        );
        let act = MINIMAL_CONFIG.replace('}', r#", "hidden_act": "swish"}"#);
        let e = err(&model_dir(&act, tiny_weights()));
        assert!(e.contains("config.json") && e.contains("swish"), "{e}");
        let no_words = tiny_weights()
            .into_iter()
            .filter(|(name, _)| !name.contains("word_embeddings"))
            .collect();
        let e = err(&model_dir(MINIMAL_CONFIG, no_words));
        assert!(
            e.contains("model.safetensors") && e.contains("embeddings.word_embeddings.weight"),
            "{e}"
        );
        let no_layer = tiny_weights()
            .into_iter()
            .filter(|(name, _)| !name.contains("output.dense.weight"))
            .collect();
        let e = err(&model_dir(MINIMAL_CONFIG, no_layer));
        assert!(e.contains("model.safetensors"), "{e}");
    }
}
