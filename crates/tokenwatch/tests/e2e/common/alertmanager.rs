// A real Alertmanager (Debian `prometheus-alertmanager`) for the tests: started on a free loopback
// port with a given configuration, polled until ready, its alerts listed, killed when dropped.

use super::{free_addr, get, send};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ALERTMANAGER: &str = "/usr/bin/prometheus-alertmanager";

pub struct Alertmanager {
    child: Child,
    pub url: String,
    log: PathBuf,
}

impl Alertmanager {
    /// Routing everything to `webhook`, grouped by `alertname`.
    pub async fn start(dir: &Path, webhook: &str) -> Alertmanager {
        Self::start_grouped(dir, webhook, "alertname").await
    }

    /// Routing everything to `webhook`, grouped by `group_by` (one label name).
    pub async fn start_grouped(dir: &Path, webhook: &str, group_by: &str) -> Alertmanager {
        Self::start_with_config(
            dir,
            &format!(
                "route:\n  receiver: hook\n  group_by: ['{group_by}']\n  group_wait: 1s\n  group_interval: 1s\n  repeat_interval: 1h\n\
                 receivers:\n  - name: hook\n    webhook_configs:\n      - url: '{webhook}'\n        send_resolved: true\n"
            ),
        )
        .await
    }

    /// With `config` as its alertmanager.yml; waits until `/-/ready` answers 200.
    pub async fn start_with_config(dir: &Path, config: &str) -> Alertmanager {
        assert!(
            Path::new(ALERTMANAGER).exists(),
            "{ALERTMANAGER} is missing — run the README's test command (scripts/test.sh), which installs Debian's `prometheus-alertmanager`"
        );
        let cfg = dir.join("alertmanager.yml");
        std::fs::write(&cfg, config).unwrap();
        // Alertmanager cannot report a port it picked: its address is chosen here.
        let addr = free_addr();
        let log = dir.join("alertmanager.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(ALERTMANAGER)
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!("--storage.path={}", dir.join("am-data").display()))
            .arg(format!("--web.listen-address={addr}"))
            // Empty: no gossip listener (it would bind 0.0.0.0:9094).
            .arg("--cluster.listen-address=")
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {ALERTMANAGER}: {e}"));
        let am = Alertmanager {
            child,
            url: format!("http://{addr}"),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = send("GET", &format!("{}/-/ready", am.url), None, &[]).await
                && r.status == 200
            {
                return am;
            }
            assert!(
                Instant::now() < deadline,
                "Alertmanager never became ready; log:\n{}",
                am.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Every alert Alertmanager lists: active, silenced, inhibited and unprocessed.
    pub async fn alerts(&self) -> Vec<serde_json::Value> {
        let url = format!(
            "{}/api/v2/alerts?active=true&silenced=true&inhibited=true&unprocessed=true",
            self.url
        );
        let r = get(&url).await;
        assert_eq!(r.status, 200, "{url}: {}", r.body);
        r.json().as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
