// Command-line arguments of `tokenwatch sim` and their translation into one
// validated `EngineConfig` per served model.

use std::net::SocketAddr;

use crate::engine::EngineConfig;
use crate::error::SimError;

/// Options of the OpenAI-compatible simulated inference server.
#[derive(clap::Args, Debug, Clone)]
pub struct SimArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8100")]
    pub listen: SocketAddr,
    /// Served model name; repeatable and/or comma-separated. Each model is its own
    /// engine on its own simulated GPU.
    #[arg(long, value_delimiter = ',', default_values_t = vec!["sim-llama-8b".to_string()])]
    pub model: Vec<String>,
    /// Base time to first token (ms) for a short prompt at an idle engine.
    #[arg(long, default_value_t = 60.0)]
    pub ttft_ms: f64,
    /// Decode step time (ms) at batch size 1.
    #[arg(long, default_value_t = 15.0)]
    pub itl_ms: f64,
    /// Cap on output length when the request gives none.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: u32,
    /// Reasoning ("thinking") tokens each completion streams before its answer. They take
    /// decode steps and count in completion/output tokens and in the reasoning-token usage.
    #[arg(long, default_value_t = 0)]
    pub reasoning_tokens: u32,
    /// Chat-completions field that carries reasoning text: `reasoning` (current vLLM) or
    /// `reasoning_content` (older vLLM).
    #[arg(long, value_enum, default_value_t = ReasoningField::Reasoning)]
    pub reasoning_field: ReasoningField,
    /// Hold a stream's response headers until its first token is ready, as the OpenAI API and
    /// buffering gateways do (vLLM sends them once the request is scheduled): a client then
    /// waits the whole time to first token for its headers.
    #[arg(long)]
    pub stream_headers_at_first_token: bool,
    /// Report the prompt tokens found in the prefix cache in chat and completions usage
    /// (`prompt_tokens_details.cached_tokens`), as vLLM's `--enable-prompt-tokens-details` does;
    /// without it `prompt_tokens_details` is null.
    #[arg(long)]
    pub enable_prompt_tokens_details: bool,
    /// Seed of the random generators (output lengths, fault draws, token text).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Fault to enable at start, `NAME[:k=v,k=v]`; repeatable. Names: kv_leak,
    /// latency_spike, length_blowup, error_burst, stall, drift (--help lists their parameters).
    #[arg(long, value_name = "NAME[:k=v,...]", long_help = crate::fault::fault_help())]
    pub fault: Vec<String>,
    /// Most sequences in the running batch.
    #[arg(long, default_value_t = 32)]
    pub max_num_seqs: usize,
    /// KV-cache capacity in blocks.
    #[arg(long, default_value_t = 4096)]
    pub kv_blocks: u32,
    /// Tokens per KV-cache block.
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    /// Longest context (prompt + output) in tokens.
    #[arg(long, default_value_t = 8192)]
    pub max_model_len: u32,
    /// Decode step slowdown per extra running sequence (step = itl × (1 + α·(n−1))).
    #[arg(long, default_value_t = 0.03)]
    pub batch_slowdown: f64,
    /// Prefill cost per prompt token (ms).
    #[arg(long, default_value_t = 0.08)]
    pub prefill_ms_per_token: f64,
    /// Slow speed drift: the base TTFT, prefill and decode step times are multiplied by
    /// 1 + AMPLITUDE·(0.7·sin(2πt/P + φ1) + 0.3·sin(2πt/(0.37·P) + φ2)), t = time since start,
    /// P = --speed-drift-period, phases from --seed. A fraction in [0, 0.9]; 0 = off.
    #[arg(
        long,
        allow_negative_numbers = true,
        value_name = "AMPLITUDE",
        default_value_t = 0.0
    )]
    pub speed_drift: f64,
    /// Main period of --speed-drift (seconds, > 0).
    #[arg(
        long,
        allow_negative_numbers = true,
        value_name = "SECONDS",
        default_value_t = 600.0
    )]
    pub speed_drift_period: f64,
    /// Simulated GPU memory (GiB).
    #[arg(long, default_value_t = 80.0)]
    pub gpu_memory_gib: f64,
    /// Memory taken by model weights on the simulated GPU (GiB).
    #[arg(long, default_value_t = 16.0)]
    pub weights_gib: f64,
    /// KV-cache bytes per token (Llama-3-8B fp16: 32 layers × 8 KV heads × 128 × 2 × 2).
    #[arg(long, default_value_t = 131_072)]
    pub kv_bytes_per_token: u64,
    /// Instance name, used as the `Hostname` label of the GPU metrics.
    #[arg(long, default_value = "sim-0")]
    pub instance_name: String,
    /// GPU model name reported in the `modelName` label.
    #[arg(long, default_value = "NVIDIA H100 80GB HBM3")]
    pub gpu_name: String,
}

/// Name of the chat-completions field (`delta.*` when streaming, `message.*` otherwise)
/// that carries reasoning text.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningField {
    /// `reasoning`, as vLLM streams it since early 2026.
    #[default]
    #[value(name = "reasoning")]
    Reasoning,
    /// `reasoning_content`, the older vLLM name.
    #[value(name = "reasoning_content")]
    ReasoningContent,
}

impl ReasoningField {
    /// The JSON key.
    pub fn key(self) -> &'static str {
        match self {
            ReasoningField::Reasoning => "reasoning",
            ReasoningField::ReasoningContent => "reasoning_content",
        }
    }
}

#[derive(clap::Parser)]
struct DefaultsOnly {
    #[command(flatten)]
    args: SimArgs,
}

impl Default for SimArgs {
    fn default() -> Self {
        use clap::Parser;
        // Parsing an empty command line cannot fail: every field has a default.
        DefaultsOnly::try_parse_from(["sim"])
            .map(|d| d.args)
            .expect("SimArgs defaults parse")
    }
}

impl SimArgs {
    /// Defaults (as on the command line) serving `models`, listening on 127.0.0.1:0.
    pub fn for_test(models: &[&str]) -> SimArgs {
        SimArgs {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            model: models.iter().map(|m| m.to_string()).collect(),
            ..SimArgs::default()
        }
    }

    /// Model names, trimmed, empty entries dropped, duplicates rejected.
    pub fn models(&self) -> Result<Vec<String>, SimError> {
        let mut out: Vec<String> = Vec::new();
        for m in self
            .model
            .iter()
            .map(|m| m.trim())
            .filter(|m| !m.is_empty())
        {
            if out.iter().any(|o| o == m) {
                return Err(SimError::InvalidArgs(format!("model `{m}` given twice")));
            }
            out.push(m.to_string());
        }
        if out.is_empty() {
            return Err(SimError::InvalidArgs(
                "at least one --model is needed".into(),
            ));
        }
        Ok(out)
    }

    /// One engine configuration per model (index = GPU index).
    pub fn engine_configs(&self) -> Result<Vec<EngineConfig>, SimError> {
        self.validate()?;
        let models = self.models()?;
        Ok(models
            .into_iter()
            .enumerate()
            .map(|(i, model)| EngineConfig {
                model,
                gpu_index: i as u32,
                max_num_seqs: self.max_num_seqs,
                kv_blocks: self.kv_blocks,
                block_size: self.block_size,
                max_model_len: self.max_model_len,
                ttft_ms: self.ttft_ms,
                itl_ms: self.itl_ms,
                batch_slowdown: self.batch_slowdown,
                prefill_ms_per_token: self.prefill_ms_per_token,
                speed_drift: self.speed_drift,
                speed_drift_period_s: self.speed_drift_period,
                default_max_tokens: self.max_tokens,
                seed: self
                    .seed
                    .wrapping_add((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                gpu_total_bytes: gib(self.gpu_memory_gib),
                weights_bytes: gib(self.weights_gib),
                block_bytes: self
                    .kv_bytes_per_token
                    .saturating_mul(u64::from(self.block_size)),
            })
            .collect())
    }

    fn validate(&self) -> Result<(), SimError> {
        let bad = |what: &str| Err(SimError::InvalidArgs(what.to_string()));
        if !(self.ttft_ms.is_finite() && self.ttft_ms >= 0.0) {
            return bad("--ttft-ms must be a number >= 0");
        }
        if !(self.itl_ms.is_finite() && self.itl_ms > 0.0) {
            return bad("--itl-ms must be a number > 0");
        }
        if !(self.batch_slowdown.is_finite() && self.batch_slowdown >= 0.0) {
            return bad("--batch-slowdown must be a number >= 0");
        }
        if !(self.prefill_ms_per_token.is_finite() && self.prefill_ms_per_token >= 0.0) {
            return bad("--prefill-ms-per-token must be a number >= 0");
        }
        if !(self.speed_drift.is_finite() && (0.0..=0.9).contains(&self.speed_drift)) {
            return bad("--speed-drift must be a fraction in [0, 0.9]");
        }
        if !(self.speed_drift_period.is_finite() && self.speed_drift_period > 0.0) {
            return bad("--speed-drift-period must be a number of seconds > 0");
        }
        if self.max_tokens == 0 || self.max_num_seqs == 0 || self.kv_blocks == 0 {
            return bad("--max-tokens, --max-num-seqs and --kv-blocks must be >= 1");
        }
        if self.block_size == 0 || self.max_model_len == 0 {
            return bad("--block-size and --max-model-len must be >= 1");
        }
        if !(self.gpu_memory_gib > 0.0 && self.weights_gib >= 0.0) {
            return bad("--gpu-memory-gib must be > 0 and --weights-gib >= 0");
        }
        Ok(())
    }
}

fn gib(v: f64) -> u64 {
    (v * 1024.0 * 1024.0 * 1024.0).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn defaults_match_brief() {
        let a = SimArgs::default();
        assert_eq!(a.listen.to_string(), "127.0.0.1:8100");
        assert_eq!(a.model, vec!["sim-llama-8b"]);
        assert_eq!(
            (a.ttft_ms, a.itl_ms, a.max_tokens, a.seed),
            (60.0, 15.0, 256, 42)
        );
        assert_eq!((a.max_num_seqs, a.kv_blocks, a.block_size), (32, 4096, 16));
    }

    #[test]
    fn models_comma_and_repeat() {
        let d = DefaultsOnly::try_parse_from(["sim", "--model", "a,b", "--model", "c"]).unwrap();
        assert_eq!(d.args.models().unwrap(), vec!["a", "b", "c"]);
        let d = DefaultsOnly::try_parse_from(["sim", "--model", "a,a"]).unwrap();
        assert!(d.args.models().is_err());
    }

    #[test]
    fn long_help_documents_every_fault_and_its_defaults() {
        use clap::CommandFactory;
        let help = DefaultsOnly::command().render_long_help().to_string();
        for f in crate::fault::FAULTS {
            assert!(
                help.contains(&format!("{}: ", f.name)),
                "{} missing:\n{help}",
                f.name
            );
            for p in f.params {
                assert!(
                    help.contains(&format!("{}=", p.key)),
                    "{}.{}:\n{help}",
                    f.name,
                    p.key
                );
            }
        }
        for line in [
            "blocks=48",
            "mib_per_s=64",
            "factor=10",
            "share=0.3",
            "status=503",
        ] {
            assert!(help.contains(line), "{line} missing:\n{help}");
        }
        assert!(help.contains("duration_s=0"), "{help}");
        // The short help stays short.
        let short = DefaultsOnly::command().render_help().to_string();
        assert!(!short.contains("mib_per_s"), "{short}");
    }

    #[test]
    fn reasoning_flags_parse_and_show_in_help() {
        use clap::CommandFactory;
        let a = SimArgs::default();
        assert_eq!(
            (a.reasoning_tokens, a.reasoning_field.key()),
            (0, "reasoning")
        );
        let d = DefaultsOnly::try_parse_from([
            "sim",
            "--reasoning-tokens",
            "64",
            "--reasoning-field",
            "reasoning_content",
        ])
        .unwrap();
        assert_eq!(d.args.reasoning_tokens, 64);
        assert_eq!(d.args.reasoning_field, ReasoningField::ReasoningContent);
        assert!(DefaultsOnly::try_parse_from(["sim", "--reasoning-field", "thoughts"]).is_err());
        let help = DefaultsOnly::command().render_help().to_string();
        for s in [
            "--reasoning-tokens",
            "--reasoning-field",
            "reasoning_content",
        ] {
            assert!(help.contains(s), "{s} missing:\n{help}");
        }
    }

    #[test]
    fn speed_drift_flags_default_off_validate_and_show_in_help() {
        use clap::CommandFactory;
        let a = SimArgs::default();
        assert_eq!((a.speed_drift, a.speed_drift_period), (0.0, 600.0));
        let cfg = &a.engine_configs().unwrap()[0];
        assert_eq!((cfg.speed_drift, cfg.speed_drift_period_s), (0.0, 600.0));
        let d = DefaultsOnly::try_parse_from([
            "sim",
            "--speed-drift",
            "0.15",
            "--speed-drift-period",
            "240",
        ])
        .unwrap();
        let cfg = &d.args.engine_configs().unwrap()[0];
        assert_eq!((cfg.speed_drift, cfg.speed_drift_period_s), (0.15, 240.0));
        for (flag, value) in [
            ("--speed-drift", "0.95"),
            ("--speed-drift", "-0.1"),
            ("--speed-drift", "NaN"),
            ("--speed-drift-period", "0"),
            ("--speed-drift-period", "-5"),
            ("--speed-drift-period", "inf"),
        ] {
            let d = DefaultsOnly::try_parse_from(["sim", flag, value]).unwrap();
            let err = d.args.engine_configs().unwrap_err().to_string();
            assert!(
                err.contains(&format!("{flag} must")),
                "{flag} {value}: {err}"
            );
        }
        let d = DefaultsOnly::try_parse_from(["sim", "--speed-drift", "0.9"]).unwrap();
        assert!(d.args.engine_configs().is_ok());
        let help = DefaultsOnly::command().render_help().to_string();
        for s in [
            "--speed-drift <AMPLITUDE>",
            "--speed-drift-period <SECONDS>",
        ] {
            assert!(help.contains(s), "{s} missing:\n{help}");
        }
    }

    #[test]
    fn for_test_uses_port_zero() {
        let a = SimArgs::for_test(&["x", "y"]);
        assert_eq!(a.listen.port(), 0);
        assert_eq!(a.engine_configs().unwrap().len(), 2);
    }
}
