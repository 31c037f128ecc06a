// The real GPU reader: NVML through `nvml-wrapper`, which loads libnvidia-ml.so.1 at run time,
// so the binary starts on machines without a driver and the source then reports itself disabled.

use super::reader::{DeviceReading, GpuError, GpuReader, GpuSnapshot, ProcessReading};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use std::collections::BTreeMap;
use std::path::Path;

/// The library NVML is loaded from when `gpu.nvml_library` is not set.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

pub struct NvmlReader {
    nvml: Nvml,
    library: String,
    driver: String,
}

impl NvmlReader {
    /// Load NVML and check that it sees at least one GPU.
    pub fn open(library: Option<&Path>) -> Result<NvmlReader, GpuError> {
        let shown = library
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| DEFAULT_LIBRARY.to_string());
        let mut builder = Nvml::builder();
        if let Some(path) = library {
            builder.lib_path(path.as_os_str());
        }
        let nvml = builder
            .init()
            .map_err(|e| GpuError::Unavailable(init_reason(&shown, &e)))?;
        let count = nvml
            .device_count()
            .map_err(|e| GpuError::Unavailable(format!("NVML ({shown}) cannot count GPUs: {e}")))?;
        if count == 0 {
            return Err(GpuError::Unavailable(format!(
                "NVML ({shown}) loaded but sees no GPU"
            )));
        }
        let driver = nvml
            .sys_driver_version()
            .unwrap_or_else(|_| "unknown".into());
        Ok(NvmlReader {
            nvml,
            library: shown,
            driver,
        })
    }
}

/// Why NVML could not start, in words a user can act on.
fn init_reason(library: &str, e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(inner) => {
            // The loader's message usually names the file already.
            let inner = inner.to_string();
            if inner.contains(library) {
                format!("cannot load the NVML library: {inner}")
            } else {
                format!("cannot load the NVML library {library}: {inner}")
            }
        }
        NvmlError::FailedToLoadSymbol(s) => format!("{library} is not a usable NVML library: {s}"),
        NvmlError::DriverNotLoaded => {
            format!("NVML ({library}) loaded but the NVIDIA driver is not running")
        }
        NvmlError::NoPermission => {
            format!("NVML ({library}) has no permission to talk to the driver")
        }
        other => format!("NVML ({library}) failed to initialise: {other}"),
    }
}

fn read_err(what: &str, index: u32, e: NvmlError) -> GpuError {
    GpuError::Read(format!("NVML: GPU {index}: {what}: {e}"))
}

impl GpuReader for NvmlReader {
    fn read(&mut self) -> Result<GpuSnapshot, GpuError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| GpuError::Read(format!("NVML: counting GPUs: {e}")))?;
        let mut snap = GpuSnapshot::default();
        for index in 0..count {
            let dev = self
                .nvml
                .device_by_index(index)
                .map_err(|e| read_err("opening", index, e))?;
            let uuid = dev.uuid().map_err(|e| read_err("uuid", index, e))?;
            let mem = dev
                .memory_info()
                .map_err(|e| read_err("memory info", index, e))?;
            // Optional readings: NotSupported on some devices (utilisation under MIG, power on some boards).
            let utilization = dev
                .utilization_rates()
                .ok()
                .map(|u| f64::from(u.gpu.min(100)) / 100.0);
            let temperature_c = dev.temperature(TemperatureSensor::Gpu).ok().map(f64::from);
            let power_w = dev.power_usage().ok().map(|mw| f64::from(mw) / 1000.0);
            // A process appears in both lists when it does compute and graphics; count it once.
            let mut processes: BTreeMap<u32, u64> = BTreeMap::new();
            let compute = dev.running_compute_processes().unwrap_or_default();
            let graphics = dev.running_graphics_processes().unwrap_or_default();
            for p in compute.into_iter().chain(graphics) {
                let used = match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => b,
                    UsedGpuMemory::Unavailable => 0,
                };
                let entry = processes.entry(p.pid).or_default();
                *entry = (*entry).max(used);
            }
            snap.processes
                .extend(processes.into_iter().map(|(pid, used)| ProcessReading {
                    pid,
                    device_uuid: uuid.clone(),
                    used_memory_bytes: used,
                    container: None,
                }));
            snap.devices.push(DeviceReading {
                index,
                name: dev.name().unwrap_or_default(),
                pci_bus_id: dev.pci_info().map(|p| p.bus_id).unwrap_or_default(),
                uuid,
                memory_used_bytes: mem.used,
                memory_total_bytes: mem.total,
                utilization,
                temperature_c,
                power_w,
            });
        }
        Ok(snap)
    }

    fn describe(&self) -> String {
        format!("NVML (driver {}, {})", self.driver, self.library)
    }

    fn backend(&self) -> &'static str {
        "nvml"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_unavailable_with_the_loader_error() {
        let err = NvmlReader::open(Some(Path::new("/nonexistent/libnvidia-ml.so.1")))
            .err()
            .unwrap();
        let GpuError::Unavailable(msg) = err else {
            panic!("expected Unavailable")
        };
        assert!(msg.starts_with("cannot load the NVML library"), "{msg}");
        assert_eq!(
            msg.matches("/nonexistent/libnvidia-ml.so.1").count(),
            1,
            "{msg}"
        );
    }

    #[test]
    fn a_library_that_is_not_nvml_is_refused() {
        // libc is loadable but has no NVML symbols.
        let err = NvmlReader::open(Some(Path::new("libc.so.6")))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("libc.so.6"), "{err}");
    }
}
