// Incidents across label sets, in the running engine: a GPU leak noticed after the KV pressure it
// causes on its replica — the leak labelled by GPU host and device, the pressure by the replica's
// instance, no model shared — joins the pressure's incident through placement and the causal
// graph; a leak on a GPU placed on another replica opens its own.

use super::*;
use tokenwatch_core::alert::Severity;
use tokenwatch_core::placement::{Placed, Site};
use tokenwatch_core::signals::{SignalBoard, SignalPoint, names};
use tokenwatch_store::{SqliteStore, StoreOptions};

const MIB: f64 = 1024.0 * 1024.0;
const REPLICA_A: &str = "10.0.0.1:8000";
const REPLICA_B: &str = "10.0.0.2:8000";

/// The KV-pressure alert of replica A, firing since a minute ago, as a restart restores it.
fn pressure_on_a(now: i64) -> Alert {
    let mut a = super::restore_tests::stored(
        "kv-a",
        "kv_cache_pressure",
        AlertState::Firing,
        now - 60_000,
    );
    a.labels = BTreeMap::from([
        ("alertname".to_string(), "kv_cache_pressure".to_string()),
        ("instance".to_string(), REPLICA_A.to_string()),
    ]);
    a.severity = Severity::Warning;
    a.incident_id = Some("inc-pressure-a".into());
    a.last_event = Some(AnomalyEvent {
        detector: "kv_cache_pressure".into(),
        signal: names::KV_CACHE_USAGE.into(),
        labels: BTreeMap::from([("instance".to_string(), REPLICA_A.to_string())]),
        score: 2.0,
        at_unix_ms: now - 1_000,
        evidence: BTreeMap::new(),
        summary: "KV cache full while requests queue".into(),
    });
    a
}

/// Replicas A and B of model m on GPU hosts gpu-a and gpu-b (their `hostname` target labels),
/// GPU-1 on gpu-a and GPU-2 on gpu-b as dcgm-exporter reports them; `leaking` climbs 256 MiB
/// every 5 s for 40 s while busy.
fn board(now: i64, leaking: &str) -> SignalBoard {
    let mut b = SignalBoard::default();
    for (replica, host, gpu) in [(REPLICA_A, "gpu-a", "GPU-1"), (REPLICA_B, "gpu-b", "GPU-2")] {
        let serving = Site::new(&format!("http://{replica}/metrics"), host, None, None);
        b.record_placement(
            Placed {
                model_id: "m".into(),
                instance: replica.into(),
                device_id: String::new(),
                site: serving,
            },
            now,
        );
        let dcgm = Site::new(&format!("http://{host}:9400/metrics"), host, None, None);
        b.record_placement(
            Placed {
                model_id: String::new(),
                instance: host.into(),
                device_id: gpu.into(),
                site: dcgm,
            },
            now,
        );
        for i in 0..9i64 {
            let at = now - 40_000 + i * 5_000;
            let climb = if gpu == leaking {
                i as f64 * 256.0 * MIB
            } else {
                0.0
            };
            for (signal, value) in [
                (names::GPU_MEMORY_USED_BYTES, 20_000.0 * MIB + climb),
                (names::GPU_UTILIZATION, 0.6),
            ] {
                b.update(SignalPoint {
                    model_id: String::new(),
                    signal: signal.into(),
                    value,
                    source: "scrape:dcgm".into(),
                    runtime: "dcgm".into(),
                    instance: host.into(),
                    device_id: gpu.into(),
                    timestamp_unix_ms: at,
                    notes: BTreeMap::new(),
                });
            }
        }
    }
    b
}

/// Starts the default rules over `board` with the pressure alert stored, waits for the leak
/// alert to fire and returns it.
async fn leak_alert(leaking: &str) -> Alert {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(dir.path(), StoreOptions::default()).unwrap());
    let now = now_unix_ms();
    store.upsert_alerts(&[pressure_on_a(now)]).unwrap();
    let (stop, started) = super::restore_tests::start_default_on(&store, board(now, leaking));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let leak = loop {
        let found = started
            .book
            .list()
            .into_iter()
            .find(|a| a.rule == "gpu_memory_leak" && a.state == AlertState::Firing);
        if let Some(a) = found {
            break a;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no leak alert: {:#?}",
            started.book.list()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let pressure = started
        .book
        .get("kv-a")
        .expect("the pressure alert is still there");
    assert_eq!(pressure.state, AlertState::Firing, "{pressure:?}");
    stop.send(true).unwrap();
    started.task.await.unwrap();
    leak
}

#[tokio::test]
async fn a_leak_noticed_after_its_replicas_pressure_joins_that_incident() {
    let leak = leak_alert("GPU-1").await;
    assert_eq!(
        (
            leak.labels.get("model_id").map(String::as_str),
            leak.labels.get("serving_instance").map(String::as_str),
            leak.labels.get("instance").map(String::as_str),
        ),
        (Some("m"), Some(REPLICA_A), Some("gpu-a")),
        "placed on replica A: {leak:?}"
    );
    assert_eq!(
        leak.incident_id.as_deref(),
        Some("inc-pressure-a"),
        "the leak joins the incident of the pressure it causes: {leak:?}"
    );
}

#[tokio::test]
async fn a_leak_on_another_replicas_gpu_opens_its_own_incident() {
    let leak = leak_alert("GPU-2").await;
    assert_eq!(
        leak.labels.get("serving_instance").map(String::as_str),
        Some(REPLICA_B),
        "{leak:?}"
    );
    assert_ne!(
        leak.incident_id.as_deref(),
        Some("inc-pressure-a"),
        "replica A's pressure is not replica B's GPU's doing: {leak:?}"
    );
}
