// Simulated GPU behind each engine: identity (as dcgm-exporter labels it) and
// readings derived from the engine's batch occupancy and KV blocks.

use serde::Serialize;

use crate::engine::EngineConfig;
use crate::metrics::EngineStats;

const MIB: u64 = 1024 * 1024;
const IDLE_POWER_W: f64 = 70.0;
const POWER_PER_UTIL_PCT_W: f64 = 6.3;
const IDLE_TEMP_C: f64 = 31.0;
const TEMP_PER_UTIL_PCT_C: f64 = 0.45;

/// One GPU's readings at the moment of a scrape.
#[derive(Debug, Clone, Serialize)]
pub struct GpuReading {
    pub index: u32,
    pub uuid: String,
    pub pci_bus_id: String,
    pub device: String,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    pub util_pct: u32,
    pub temp_c: u32,
    pub power_w: f64,
    /// Per-process memory as NVML reports it (nvmlDeviceGetComputeRunningProcesses): the
    /// serving process holds everything on this GPU.
    pub processes: Vec<GpuProcess>,
}

/// One compute process on a GPU, NVML-shaped (pid, device, used memory).
#[derive(Debug, Clone, Serialize)]
pub struct GpuProcess {
    pub pid: u32,
    pub device_uuid: String,
    pub used_memory_bytes: u64,
}

impl GpuReading {
    pub fn fb_used_mib(&self) -> u64 {
        self.memory_used_bytes / MIB
    }

    pub fn fb_free_mib(&self) -> u64 {
        self.memory_total_bytes
            .saturating_sub(self.memory_used_bytes)
            / MIB
    }
}

/// Stable fake UUID in NVIDIA's format, derived from the seed and GPU index.
fn uuid(seed: u64, index: u32) -> String {
    let mut x = seed ^ (u64::from(index) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (a, b, c) = (next(), next(), next());
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        c & 0xffff_ffff_ffff
    )
}

/// Readings for the GPU serving `cfg`. Memory = weights + the whole KV pool, reserved at start
/// as vLLM does (so it stays flat however busy the engine is) + what the `kv_leak` fault leaked
/// outside the pool (each finished request's lost blocks plus a steady per-second leak), so used
/// memory climbs while free KV blocks shrink. Utilisation is the share of batch slots in use.
pub fn reading(cfg: &EngineConfig, stats: &EngineStats) -> GpuReading {
    let pool = u64::from(cfg.kv_blocks).saturating_mul(cfg.block_bytes);
    let used = cfg
        .weights_bytes
        .saturating_add(pool)
        .saturating_add(stats.leaked_bytes)
        .min(cfg.gpu_total_bytes);
    let uuid = uuid(cfg.seed, cfg.gpu_index);
    // Share of the batch slots in use: an idle engine reads 0 %, a full batch 100 %, and an
    // engine a leak has starved of KV blocks (one sequence at a time) a few percent, as in the
    // seed incident (< 5 % while memory climbs).
    let occupancy = stats.running as f64 / cfg.max_num_seqs.max(1) as f64;
    let util = (100.0 * occupancy).clamp(0.0, 100.0);
    GpuReading {
        index: cfg.gpu_index,
        processes: vec![GpuProcess {
            pid: std::process::id(),
            device_uuid: uuid.clone(),
            used_memory_bytes: used,
        }],
        uuid,
        pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + cfg.gpu_index),
        device: format!("nvidia{}", cfg.gpu_index),
        memory_used_bytes: used,
        memory_total_bytes: cfg.gpu_total_bytes,
        util_pct: util.round() as u32,
        temp_c: (IDLE_TEMP_C + TEMP_PER_UTIL_PCT_C * util).round() as u32,
        power_w: IDLE_POWER_W + POWER_PER_UTIL_PCT_W * util,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_shape_is_stable() {
        let u = uuid(42, 0);
        assert_eq!(u, uuid(42, 0));
        assert_ne!(u, uuid(42, 1));
        assert_eq!(
            u.len(),
            "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43".len(),
            "{u}"
        );
    }
}
