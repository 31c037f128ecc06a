// A sentence embedder of the all-MiniLM-L6-v2 kind on candle: a BERT encoder read from a local
// directory, mean pooling over the attention mask and L2 normalisation, as sentence-transformers.

use super::EmbedError;
use candle_core::{D, DType, Device, Module, Tensor};
use candle_nn::{Embedding, LayerNorm, Linear, VarBuilder};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

/// Token limit when the directory has no `sentence_bert_config.json` (all-MiniLM-L6-v2's).
const DEFAULT_MAX_TOKENS: usize = 256;

/// The fields of a BERT `config.json` this encoder reads.
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

struct Attention {
    query: Linear,
    key: Linear,
    value: Linear,
    output: Linear,
    norm: LayerNorm,
    heads: usize,
    head_dim: usize,
}

impl Attention {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (n, hidden) = x.dims2()?;
        let split = |t: Tensor| -> candle_core::Result<Tensor> {
            t.reshape((n, self.heads, self.head_dim))?
                .transpose(0, 1)?
                .contiguous()
        };
        let q = split(self.query.forward(x)?)?;
        let k = split(self.key.forward(x)?)?;
        let v = split(self.value.forward(x)?)?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let scores = (q.matmul(&k.t()?)? * scale)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let context = probs
            .matmul(&v)?
            .transpose(0, 1)?
            .contiguous()?
            .reshape((n, hidden))?;
        self.norm.forward(&(self.output.forward(&context)? + x)?)
    }
}

struct Layer {
    attention: Attention,
    intermediate: Linear,
    output: Linear,
    norm: LayerNorm,
    tanh_gelu: bool,
}

impl Layer {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let a = self.attention.forward(x)?;
        let h = self.intermediate.forward(&a)?;
        let h = if self.tanh_gelu {
            h.gelu()?
        } else {
            h.gelu_erf()?
        };
        self.norm.forward(&(self.output.forward(&h)? + a)?)
    }
}

/// The encoder and its tokenizer, loaded once; `embed` is safe to call from any one thread.
pub struct SentenceEmbedder {
    tokenizer: Tokenizer,
    words: Embedding,
    positions: Embedding,
    token_type: Tensor,
    embed_norm: LayerNorm,
    layers: Vec<Layer>,
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
        let tanh_gelu = match config.hidden_act.as_str() {
            "gelu" => false,
            "gelu_new" | "gelu_pytorch_tanh" => true,
            other => {
                return Err(model_error(
                    &config_path,
                    format_args!("hidden_act {other:?} is not supported (gelu only)"),
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
        let prefixed = tensors.keys().any(|k| k.starts_with("bert."));
        let vb = VarBuilder::from_tensors(tensors, DType::F32, &device);
        let vb = if prefixed { vb.pp("bert") } else { vb };
        Self::build(vb, &config, tanh_gelu, tokenizer, max_tokens)
            .map_err(|e| model_error(&weights_path, e))
    }

    fn build(
        vb: VarBuilder,
        c: &BertConfig,
        tanh_gelu: bool,
        tokenizer: Tokenizer,
        max_tokens: usize,
    ) -> candle_core::Result<SentenceEmbedder> {
        let h = c.hidden_size;
        let norm = |vb: VarBuilder| -> candle_core::Result<LayerNorm> {
            let weight = vb.get(h, "weight").or_else(|_| vb.get(h, "gamma"))?;
            let bias = vb.get(h, "bias").or_else(|_| vb.get(h, "beta"))?;
            Ok(LayerNorm::new(weight, bias, c.layer_norm_eps))
        };
        let e = vb.pp("embeddings");
        let word_table = e.pp("word_embeddings").get_unchecked("weight")?;
        let vocab = word_table.dim(0)?;
        let words = candle_nn::embedding(vocab, h, e.pp("word_embeddings"))?;
        let positions =
            candle_nn::embedding(c.max_position_embeddings, h, e.pp("position_embeddings"))?;
        let type_table = e.pp("token_type_embeddings").get_unchecked("weight")?;
        let token_type = type_table.get(0)?;
        let embed_norm = norm(e.pp("LayerNorm"))?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let l = vb.pp(format!("encoder.layer.{i}"));
            let a = l.pp("attention");
            layers.push(Layer {
                attention: Attention {
                    query: candle_nn::linear(h, h, a.pp("self.query"))?,
                    key: candle_nn::linear(h, h, a.pp("self.key"))?,
                    value: candle_nn::linear(h, h, a.pp("self.value"))?,
                    output: candle_nn::linear(h, h, a.pp("output.dense"))?,
                    norm: norm(a.pp("output.LayerNorm"))?,
                    heads: c.num_attention_heads,
                    head_dim: h / c.num_attention_heads,
                },
                intermediate: {
                    let w = l.pp("intermediate.dense").get_unchecked("weight")?;
                    let inner = w.dim(0)?;
                    candle_nn::linear(h, inner, l.pp("intermediate.dense"))?
                },
                output: {
                    let w = l.pp("output.dense").get_unchecked("weight")?;
                    let inner = w.dim(1)?;
                    candle_nn::linear(inner, h, l.pp("output.dense"))?
                },
                norm: norm(l.pp("output.LayerNorm"))?,
                tanh_gelu,
            });
        }
        Ok(SentenceEmbedder {
            tokenizer,
            words,
            positions,
            token_type,
            embed_norm,
            layers,
            hidden: h,
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
        let n = ids.len();
        let device = Device::Cpu;
        let ids_t = Tensor::new(ids, &device)?;
        let pos: Vec<u32> = (0..n as u32).collect();
        let pos_t = Tensor::new(pos.as_slice(), &device)?;
        let x = self.words.forward(&ids_t)?;
        let x = (x + self.positions.forward(&pos_t)?)?;
        let x = x.broadcast_add(&self.token_type)?;
        let mut x = self.embed_norm.forward(&x)?;
        for layer in &self.layers {
            x = layer.forward(&x)?;
        }
        // One unpadded sentence: every token is under the attention mask, so the masked mean
        // is the mean over all tokens.
        let mean = x.mean(0)?;
        let norm = mean
            .sqr()?
            .sum_keepdim(D::Minus1)?
            .sqrt()?
            .clamp(1e-12, f32::MAX)?;
        mean.broadcast_div(&norm)?.to_vec1::<f32>()
    }
}
