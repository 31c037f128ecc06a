// A fake GPU that replays a recorded series (JSON lines, one `GpuSnapshot` per line), so the
// whole GPU path runs in tests and demos without a GPU. At the end it holds the last value or loops.

use super::reader::{GpuError, GpuReader, GpuSnapshot};
use std::path::{Path, PathBuf};

/// Largest replay file accepted (a recording is a few hundred KiB).
const MAX_REPLAY_BYTES: u64 = 64 * 1024 * 1024;

pub struct ReplayReader {
    path: PathBuf,
    samples: Vec<GpuSnapshot>,
    next: usize,
    looping: bool,
}

impl ReplayReader {
    /// Load the whole recording; errors name the file and the line.
    pub fn open(path: &Path, looping: bool) -> Result<ReplayReader, GpuError> {
        let shown = path.display();
        let size = std::fs::metadata(path)
            .map_err(|e| GpuError::Unavailable(format!("gpu.replay {shown}: {e}")))?
            .len();
        if size > MAX_REPLAY_BYTES {
            return Err(GpuError::Unavailable(format!(
                "gpu.replay {shown}: {size} bytes is more than the {MAX_REPLAY_BYTES} accepted"
            )));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| GpuError::Unavailable(format!("gpu.replay {shown}: {e}")))?;
        let samples = parse_lines(&text)
            .map_err(|e| GpuError::Unavailable(format!("gpu.replay {shown}: {e}")))?;
        Ok(ReplayReader {
            path: path.to_path_buf(),
            samples,
            next: 0,
            looping,
        })
    }

    pub fn from_samples(path: &Path, samples: Vec<GpuSnapshot>, looping: bool) -> ReplayReader {
        ReplayReader {
            path: path.to_path_buf(),
            samples,
            next: 0,
            looping,
        }
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

/// One snapshot per non-empty line; `#` lines are comments.
pub fn parse_lines(text: &str) -> Result<Vec<GpuSnapshot>, String> {
    let mut samples = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let s: GpuSnapshot =
            serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1))?;
        samples.push(s);
    }
    if samples.is_empty() {
        return Err("no samples (expected one JSON GPU snapshot per line)".into());
    }
    Ok(samples)
}

impl GpuReader for ReplayReader {
    fn read(&mut self) -> Result<GpuSnapshot, GpuError> {
        let Some(last) = self.samples.len().checked_sub(1) else {
            return Err(GpuError::Read(format!(
                "gpu.replay {}: no samples",
                self.path.display()
            )));
        };
        let i = self.next.min(last);
        self.next = if self.next >= last && self.looping {
            0
        } else {
            (self.next + 1).min(last)
        };
        Ok(self.samples[i].clone())
    }

    fn describe(&self) -> String {
        let end = if self.looping {
            "looping"
        } else {
            "holding the last sample at the end"
        };
        format!(
            "replay of {} ({} samples, {end})",
            self.path.display(),
            self.samples.len()
        )
    }

    fn backend(&self) -> &'static str {
        "replay"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(used: u64) -> String {
        format!(
            r#"{{"devices":[{{"index":0,"uuid":"GPU-a","memory_used_bytes":{used},"memory_total_bytes":100}}],"processes":[{{"pid":1,"device_uuid":"GPU-a","used_memory_bytes":{used}}}]}}"#
        )
    }

    fn used(r: &mut ReplayReader) -> u64 {
        r.read().unwrap().devices[0].memory_used_bytes
    }

    #[test]
    fn holds_the_last_value_or_loops() {
        let text = format!(
            "# recorded\n{}\n\n{}\n{}\n",
            sample(1),
            sample(2),
            sample(3)
        );
        let samples = parse_lines(&text).unwrap();
        let mut hold = ReplayReader::from_samples(Path::new("x"), samples.clone(), false);
        let seen: Vec<u64> = (0..5).map(|_| used(&mut hold)).collect();
        assert_eq!(seen, vec![1, 2, 3, 3, 3]);
        let mut looping = ReplayReader::from_samples(Path::new("x"), samples, true);
        let seen: Vec<u64> = (0..7).map(|_| used(&mut looping)).collect();
        assert_eq!(seen, vec![1, 2, 3, 1, 2, 3, 1]);
        assert!(looping.describe().contains("3 samples"));
    }

    #[test]
    fn bad_lines_are_named() {
        let err = parse_lines(&format!("{}\n{{\"devices\": 3}}\n", sample(1))).unwrap_err();
        assert!(err.starts_with("line 2:"), "{err}");
        assert!(
            parse_lines("\n# only comments\n")
                .unwrap_err()
                .contains("no samples")
        );
        let err = ReplayReader::open(Path::new("/nonexistent/replay.jsonl"), false)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("gpu.replay /nonexistent/replay.jsonl"),
            "{err}"
        );
    }

    #[test]
    fn the_recorded_fixture_loads_and_leaks() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/gpu-leak-replay.jsonl");
        let mut r = ReplayReader::open(&path, false).unwrap();
        assert_eq!(r.len(), 60);
        let first = r.read().unwrap();
        assert_eq!(first.devices.len(), 2);
        assert_eq!(first.processes.len(), 2);
        let mut last = first.clone();
        for _ in 1..60 {
            last = r.read().unwrap();
        }
        let grew = last.devices[0].memory_used_bytes - first.devices[0].memory_used_bytes;
        assert_eq!(grew, 59 * 256 * 1024 * 1024);
        assert!(last.devices[0].utilization.unwrap() < 0.05);
        assert!(
            last.devices[1]
                .memory_used_bytes
                .abs_diff(first.devices[1].memory_used_bytes)
                < 1 << 30
        );
    }
}
