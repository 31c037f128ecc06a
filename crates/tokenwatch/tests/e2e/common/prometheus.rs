// A real Prometheus (Debian's `prometheus`) with the configuration a test gives it and its own
// storage, on a loopback port, ready when `start` returns and killed when dropped.

use super::{free_addr, promtool, send};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Prometheus {
    child: Child,
    pub url: String,
    log: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts Prometheus with `config` (its prometheus.yml) in `dir`; waits for `/-/ready`.
    pub async fn start(dir: &Path, config: &str) -> Prometheus {
        let bin = promtool().with_file_name("prometheus");
        assert!(
            bin.exists(),
            "{} is missing — run scripts/test.sh, which installs Debian's `prometheus` package",
            bin.display()
        );
        let cfg = dir.join("prometheus.yml");
        std::fs::write(&cfg, config).unwrap();
        // Prometheus cannot report a port it picked: its address is chosen here.
        let addr = free_addr();
        let log = dir.join("prometheus.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(&bin)
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("prom-data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let p = Prometheus {
            child,
            url: format!("http://{addr}"),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = send("GET", &format!("{}/-/ready", p.url), None, &[]).await
                && r.status == 200
            {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus never became ready; log:\n{}",
                p.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}
