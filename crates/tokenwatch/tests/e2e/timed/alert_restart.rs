// Alerts across restarts, through the real binary: a firing alert keeps its id, activation and
// firing time over a SIGTERM restart without being announced again as new, then resolves, and the
// resolved alert is still listed after another restart (SQLite `alerts` table).

use crate::alerting_support;
use crate::common;

use alerting_support::{FAST, Hook, Traffic};
use common::{Proc, free_addr, get, send, start_sim, start_tokenwatch, wait_ready};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const RULE: &str = "error_burst";

struct Setup {
    dir: tempfile::TempDir,
    sim: SocketAddr,
    api: SocketAddr,
    proxy: SocketAddr,
    config: String,
}

impl Setup {
    fn start_tw(&self) -> Proc {
        start_tokenwatch(
            self.dir.path(),
            self.api,
            self.proxy,
            &format!("http://{}", self.sim),
            &["--config", &self.config],
        )
    }

    async fn alerts(&self) -> Vec<Value> {
        let r = get(&format!("http://{}/api/v1/alerts", self.api)).await;
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["alerts"].as_array().cloned().unwrap_or_default()
    }

    async fn by_id(&self, id: &str) -> Option<Value> {
        self.alerts().await.into_iter().find(|a| a["id"] == id)
    }

    async fn fault(&self, method: &str, path: &str, body: Option<&str>) {
        let r = send(method, &format!("http://{}{path}", self.sim), body, &[])
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{method} {path}: {}", r.body);
    }
}

async fn wait_until<F, Fut>(what: &str, within: Duration, tw: &Proc, mut f: F) -> Value
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<Value>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() > deadline {
            let log = tw.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "{what}: not within {within:?}; tokenwatch log tail:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn firing_alert_survives_restart_without_renotifying_then_resolves_and_stays_listed() {
    let (hook, hook_url) = Hook::serve().await;
    let dir = tempfile::tempdir().unwrap();
    let (_sim, sim) = start_sim(dir.path(), FAST).await;
    // A resolve delay longer than a restart plus the burst window refilling, so the alert stays
    // firing across the restart while the fault lasts.
    let cfg = dir.path().join("tokenwatch.yaml");
    std::fs::write(
        &cfg,
        format!(
            "alerting:\n  resolve_after: 15s\n  delivery:\n    webhooks:\n      - url: '{hook_url}'\n"
        ),
    )
    .unwrap();
    let s = Setup {
        config: cfg.display().to_string(),
        dir,
        sim,
        // Fixed ports: tokenwatch is restarted on the same ones while the traffic goes on.
        api: free_addr(),
        proxy: free_addr(),
    };
    let mut tw = s.start_tw();
    wait_ready(&format!("http://{}/readyz", s.api), &tw).await;
    let traffic = Traffic::plain(s.proxy, 4);
    let deadline = Instant::now() + Duration::from_secs(20);
    while traffic.done.load(Ordering::Relaxed) < 60 {
        assert!(Instant::now() < deadline, "no traffic through the proxy");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.fault(
        "POST",
        "/admin/faults",
        Some(&json!({ "spec": "error_burst:rate=0.5" }).to_string()),
    )
    .await;

    let fired = wait_until(
        "a firing error_burst alert",
        Duration::from_secs(20),
        &tw,
        || async {
            s.alerts()
                .await
                .into_iter()
                .find(|a| a["rule"] == RULE && a["state"] == "firing")
        },
    )
    .await;
    let id = fired["id"].as_str().unwrap().to_string();
    wait_until(
        "the firing webhook",
        Duration::from_secs(10),
        &tw,
        || async {
            hook.of(RULE, "firing")
                .into_iter()
                .find(|b| b["alert"]["id"] == id.as_str())
        },
    )
    .await;

    // SIGTERM and restart on the same data directory, the fault still on.
    assert!(tw.terminate().success(), "tokenwatch did not exit cleanly");
    let firing_before = hook.of(RULE, "firing").len();
    tw = s.start_tw();
    wait_ready(&format!("http://{}/readyz", s.api), &tw).await;
    let restored = s
        .by_id(&id)
        .await
        .unwrap_or_else(|| panic!("alert {id} not listed after the restart: {:#?}", fired));
    assert_eq!(restored["state"], "firing", "{restored:#}");
    assert_eq!(restored["fingerprint"], fired["fingerprint"]);
    assert_eq!(restored["active_at_unix_ms"], fired["active_at_unix_ms"]);
    assert_eq!(restored["fired_at_unix_ms"], fired["fired_at_unix_ms"]);
    assert_eq!(restored["incident_id"], fired["incident_id"]);

    // With the fault on for a while longer: still the same alert, and no new announcement.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let all = s.alerts().await;
    let active: Vec<&Value> = all
        .iter()
        .filter(|a| a["rule"] == RULE && a["state"] != "resolved")
        .collect();
    assert_eq!(active.len(), 1, "{all:#?}");
    assert_eq!(active[0]["id"], id.as_str(), "{all:#?}");
    assert_eq!(active[0]["state"], "firing");
    let new_firing = hook.of(RULE, "firing");
    assert_eq!(
        new_firing.len(),
        firing_before,
        "a restored alert was announced again: {:#?}",
        &new_firing[firing_before..]
    );

    // Fault off: it resolves through the resolve delay, and the receiver hears so.
    s.fault("DELETE", "/admin/faults/error_burst", None).await;
    let resolved = wait_until(
        "the alert resolved",
        Duration::from_secs(45),
        &tw,
        || async { s.by_id(&id).await.filter(|a| a["state"] == "resolved") },
    )
    .await;
    wait_until(
        "the resolved webhook",
        Duration::from_secs(10),
        &tw,
        || async {
            hook.of(RULE, "resolved")
                .into_iter()
                .find(|b| b["alert"]["id"] == id.as_str())
        },
    )
    .await;
    traffic.stop().await;

    // Another restart: still listed as resolved, same times.
    assert!(tw.terminate().success(), "tokenwatch did not exit cleanly");
    tw = s.start_tw();
    wait_ready(&format!("http://{}/readyz", s.api), &tw).await;
    let again = s
        .by_id(&id)
        .await
        .unwrap_or_else(|| panic!("resolved alert {id} not listed after the second restart"));
    assert_eq!(again["state"], "resolved", "{again:#}");
    assert_eq!(
        again["resolved_at_unix_ms"],
        resolved["resolved_at_unix_ms"]
    );
    assert_eq!(again["active_at_unix_ms"], fired["active_at_unix_ms"]);
    assert!(
        !s.alerts()
            .await
            .iter()
            .any(|a| a["rule"] == RULE && a["state"] != "resolved"),
        "an error_burst alert is active again after the restart"
    );
    drop(tw);
}
