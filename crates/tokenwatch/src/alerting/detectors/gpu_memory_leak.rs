// `gpu_memory_leak`: GPU memory growing per (instance, device) — large steps, a steady climb while
// idle, or (sequential test, under load too) growth far beyond the GPU's usual swing past the
// most it held before — and its PromQL form over dcgm-exporter (growth, exhaustion and, for
// configured rules, step rules).

use super::{BuiltinExport, Detector, EvalCtx, PromCtx, PromRule, RuleInput};
use crate::alerting::engine::eval::labels;
use crate::alerting::engine::inputs;
use crate::alerting::promexport::{num, prom_duration};
use crate::alerting::rules::{RuleError, RuleSpec};
use std::time::Duration;
use tokenwatch_core::alert::{AnomalyEvent, Severity};
use tokenwatch_core::signals::names;
use tokenwatch_detect as det;

const MIB: f64 = 1024.0 * 1024.0;
/// Horizon of the exported exhaustion rule (`predict_linear`).
const EXHAUSTION_HORIZON_S: f64 = 3600.0;

pub struct GpuMemoryLeak {
    pub params: det::GpuLeakParams,
}

impl Detector for GpuMemoryLeak {
    fn name() -> &'static str {
        "gpu_memory_leak"
    }

    fn default_window_s() -> i64 {
        120
    }

    fn compile(rule: &RuleInput) -> Result<(Self, String), RuleError> {
        let params = rule.validated()?;
        let signal = rule.signal(&["gpu_memory_used_bytes"], "gpu_memory_used_bytes")?;
        Ok((GpuMemoryLeak { params }, signal))
    }

    /// Scraped DCGM series are coarser than tokenwatch's: the exported rule watches 10 minutes
    /// for 128 MiB/min (the engine's default is 1 MiB/s) and holds 5 minutes.
    fn builtin_export() -> Option<BuiltinExport> {
        let summary = "GPU memory grows steadily while the GPU is idle: likely leak";
        Some(
            BuiltinExport::new(
                3,
                "gpu_memory_leak",
                Self::name(),
                Severity::Critical,
                summary,
            )
            .window_s(600)
            .for_s(300)
            .param("min_slope_bytes_per_s", (128.0 * MIB / 60.0).into()),
        )
    }

    fn evaluate(&mut self, rule: &RuleSpec, cx: &EvalCtx) -> Vec<AnomalyEvent> {
        let (now, w) = (cx.now, rule.window_ms);
        let mut out = Vec::new();
        for s in inputs::signal_series(cx.board, names::GPU_MEMORY_USED_BYTES, now - w) {
            let util = inputs::history(
                cx.board,
                &s.model,
                names::GPU_UTILIZATION,
                &s.instance,
                &s.device,
                now - w,
            );
            let total = inputs::history(
                cx.board,
                &s.model,
                names::GPU_MEMORY_TOTAL_BYTES,
                &s.instance,
                &s.device,
                now - w,
            )
            .last()
            .map(|(_, v)| *v)
            .unwrap_or(0.0);
            let found =
                det::gpu_memory_leak(&s.history, &util, total, &self.params).or_else(|| {
                    // The sequential test reads back over its baseline, beyond the window.
                    let p = &self.params;
                    let back = ((p.baseline_s + p.test_s) * 1000.0) as i64;
                    let used = inputs::history(
                        cx.board,
                        &s.model,
                        names::GPU_MEMORY_USED_BYTES,
                        &s.instance,
                        &s.device,
                        now - back,
                    );
                    det::gpu_memory_leak_sequential(&used, total, p)
                });
            if let Some(f) = found {
                let l = labels(&[
                    ("model_id", &s.model),
                    ("instance", &s.instance),
                    ("device_id", &s.device),
                ]);
                out.push(f.into_event(&rule.detector, names::GPU_MEMORY_USED_BYTES, l, now));
            }
        }
        out
    }

    fn gpu_memory(&self, _rule: &RuleSpec) -> bool {
        true
    }

    /// `deriv(DCGM_FI_DEV_FB_USED)` over the growth limit with `DCGM_FI_DEV_GPU_UTIL` under the
    /// utilisation limit, plus a `predict_linear` exhaustion rule; configured rules also get
    /// their step rule (`consecutive` × `step_mib` of growth over the window, still rising).
    fn promql(&self, x: &PromCtx) -> Result<Vec<PromRule>, String> {
        let p = &self.params;
        let name = &x.rule.name;
        let (g, util, w) = (
            p.min_slope_bytes_per_s * 60.0 / MIB,
            p.max_utilization,
            x.window()?,
        );
        let horizon = EXHAUSTION_HORIZON_S;
        // DCGM reports framebuffer memory in MiB and utilisation in percent.
        let leak = format!(
            "deriv(DCGM_FI_DEV_FB_USED[{w}]) * 60 > {} and on (instance, gpu, UUID) DCGM_FI_DEV_GPU_UTIL < {}",
            num(g),
            num(util * 100.0)
        );
        let exhaustion = format!(
            "predict_linear(DCGM_FI_DEV_FB_USED[{w}], {}) >= (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) and deriv(DCGM_FI_DEV_FB_USED[{w}]) > 0",
            num(horizon.round())
        );
        let mut out = Vec::new();
        if !x.builtin {
            let (step, n) = (p.step_bytes / MIB, p.consecutive as f64);
            let steps = format!(
                "delta(DCGM_FI_DEV_FB_USED[{w}]) >= {} and deriv(DCGM_FI_DEV_FB_USED[{w}]) > 0",
                num(step * n)
            );
            out.push(PromRule::new(
                format!("{name}_steps"),
                steps,
                format!("GPU {{{{ $labels.gpu }}}} ({{{{ $labels.UUID }}}}) on {{{{ $labels.instance }}}}: used memory grew {{{{ $value | humanize }}}} MiB within {w} and is still rising ({} steps of {} MiB make a leak).", num(n), num(step)),
            ));
        }
        out.extend([
            PromRule::new(name.clone(), leak, "GPU {{ $labels.gpu }} ({{ $labels.UUID }}) on {{ $labels.instance }}: used memory grows {{ $value | humanize }} MiB/min while nearly idle.".into()),
            PromRule::new(
                format!("{name}_exhaustion"),
                exhaustion,
                format!("GPU {{{{ $labels.gpu }}}} ({{{{ $labels.UUID }}}}) on {{{{ $labels.instance }}}} will run out of memory within {} at the current growth.", prom_duration(Duration::from_secs(horizon.round() as u64))),
            ),
        ]);
        Ok(out)
    }
}
