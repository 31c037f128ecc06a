// Alert delivery against real receivers: the Notifier (in-process, through the library) sends to a
// real Alertmanager 0.25 (Debian `prometheus-alertmanager`) and to in-test webhook servers.

use crate::common;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use common::alertmanager::Alertmanager;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokenwatch::alerting::deliver::{DeliveryConfig, Notifier, WebhookConfig, WebhookFormat};
use tokenwatch::config::HumanDuration;
use tokenwatch::export::prometheus::Metrics;
use tokenwatch_core::alert::{Alert, AlertState, CauseCandidate, Severity};
use tokio::sync::watch;

/// A webhook endpoint recording what it receives; answers 500 to the first `fail_first` requests.
#[derive(Clone, Default)]
struct Hook {
    received: Arc<Mutex<Vec<(HeaderMap, serde_json::Value)>>>,
    requests: Arc<AtomicUsize>,
    fail_first: usize,
}

impl Hook {
    async fn serve(fail_first: usize) -> (Hook, String) {
        let hook = Hook {
            fail_first,
            ..Default::default()
        };
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(hook.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (hook, format!("http://{addr}/hook"))
    }

    fn bodies(&self) -> Vec<serde_json::Value> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .map(|(_, b)| b.clone())
            .collect()
    }

    async fn wait_for(
        &self,
        what: &str,
        within: Duration,
        pred: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + within;
        loop {
            let b = self.bodies();
            if pred(&b) {
                return b;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not received within {within:?}; got {b:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn receive(State(h): State<Hook>, headers: HeaderMap, body: axum::body::Bytes) -> StatusCode {
    if h.requests.fetch_add(1, Ordering::SeqCst) < h.fail_first {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    let v = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    h.received.lock().unwrap().push((headers, v));
    StatusCode::OK
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn alert(id: &str, state: AlertState) -> Alert {
    let now = now_ms();
    Alert {
        id: id.into(),
        fingerprint: format!("fp-{id}"),
        rule: "ttft_p99_spike".into(),
        labels: BTreeMap::from([
            ("model_id".into(), "m1".into()),
            ("instance".into(), "10.0.0.7:8000".into()),
        ]),
        annotations: BTreeMap::from([(
            "summary".into(),
            "TTFT P99 of m1 is 3.1x the previous minute".into(),
        )]),
        severity: Severity::Critical,
        grade: Some("L2".into()),
        state,
        active_at_unix_ms: now - 120_000,
        fired_at_unix_ms: (state != AlertState::Pending).then_some(now - 60_000),
        resolved_at_unix_ms: (state == AlertState::Resolved).then_some(now - 1_000),
        last_event: None,
        root_cause: vec![CauseCandidate {
            detector: "gpu_memory_leak".into(),
            signal: "gpu_memory_used_bytes".into(),
            labels: BTreeMap::new(),
            confidence: 0.8,
            expected_delay_ms: 30_000,
            observed_delay_ms: 28_000,
            alignment: 0.95,
            rank: 0.76,
            path: vec![
                "gpu_memory_leak".into(),
                "kv_cache_pressure".into(),
                "latency_spike".into(),
            ],
            summary: "GPU-0 grows 512 MiB/min while idle".into(),
        }],
        incident_id: Some("inc-1".into()),
        snapshot: Some("/data/snapshots/al-1.json.gz".into()),
    }
}

fn counter(metrics: &Metrics, receiver: &str, outcome: &str) -> f64 {
    let series = format!(
        "tokenwatch_alert_notifications_total{{receiver=\"{receiver}\",outcome=\"{outcome}\"}}"
    );
    common::metric_value(&metrics.encode(), &series).unwrap_or(0.0)
}

/// Waits (10 s at most) until `receiver` has counted a notification as `outcome`.
async fn wait_counted(metrics: &Metrics, receiver: &str, outcome: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter(metrics, receiver, outcome) < 1.0 {
        assert!(
            Instant::now() < deadline,
            "{what} was never counted {outcome}:\n{}",
            metrics.encode()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (10 s at most) until Alertmanager lists the alert `id`; returns it.
async fn wait_listed(am: &Alertmanager, id: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(a) = find(&am.alerts().await, id) {
            return a.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{id} never listed by Alertmanager; its log:\n{}",
            am.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn find<'a>(alerts: &'a [serde_json::Value], id: &str) -> Option<&'a serde_json::Value> {
    alerts
        .iter()
        .find(|a| a["annotations"]["tokenwatch_alert_id"] == id)
}

fn parse_time(v: &serde_json::Value) -> chrono::DateTime<chrono::FixedOffset> {
    chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{v}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alertmanager_receives_resends_and_resolves() {
    let dir = tempfile::tempdir().unwrap();
    let (am_hook, am_hook_url) = Hook::serve(0).await;
    let am = Alertmanager::start(dir.path(), &am_hook_url).await;
    let metrics = Arc::new(Metrics::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    let cfg = DeliveryConfig {
        alertmanagers: vec![am.url.clone()],
        resend_interval: HumanDuration(Duration::from_secs(1)),
        external_url: "http://127.0.0.1:9464".into(),
        ..Default::default()
    };
    cfg.validate().unwrap();
    let (notifier, tasks) = Notifier::start(cfg, metrics.clone(), stop_rx);
    let receiver = notifier.receiver_names()[0].clone();
    assert_eq!(
        receiver,
        format!("alertmanager:{}", am.url.trim_start_matches("http://"))
    );

    // Firing: listed by Alertmanager, active, with our labels and annotations.
    let firing = alert("al-1", AlertState::Firing);
    notifier.notify(&firing);
    let listed = wait_listed(&am, "al-1").await;
    assert_eq!(listed["status"]["state"], "active", "{listed:#}");
    let labels = &listed["labels"];
    assert_eq!(labels["alertname"], "ttft_p99_spike");
    assert_eq!(labels["severity"], "critical");
    assert_eq!(labels["grade"], "L2");
    assert_eq!(labels["model_id"], "m1");
    assert_eq!(labels["instance"], "10.0.0.7:8000");
    let ann = &listed["annotations"];
    assert_eq!(ann["summary"], "TTFT P99 of m1 is 3.1x the previous minute");
    assert_eq!(
        ann["root_cause"],
        "gpu_memory_leak → kv_cache_pressure → latency_spike (rank 0.76): GPU-0 grows 512 MiB/min while idle"
    );
    assert_eq!(
        ann["snapshot"],
        "http://127.0.0.1:9464/api/v1/alerts/al-1/snapshot"
    );
    assert_eq!(
        listed["generatorURL"],
        "http://127.0.0.1:9464/api/v1/alerts/al-1"
    );
    assert_eq!(ann["tokenwatch_url"], "http://127.0.0.1:9464/#/alerts/al-1");
    assert_eq!(
        parse_time(&listed["startsAt"]).timestamp_millis(),
        firing.fired_at_unix_ms.unwrap()
    );
    let first_ends = parse_time(&listed["endsAt"]);
    let ttl = first_ends.timestamp_millis() - now_ms();
    assert!(
        (1_000..=4_500).contains(&ttl),
        "endsAt = now + 4 × resend interval, got +{ttl} ms"
    );

    // Alertmanager routes it on to its own receiver.
    am_hook
        .wait_for(
            "Alertmanager's firing notification",
            Duration::from_secs(10),
            |b| {
                b.iter().any(|n| {
                    n["status"] == "firing"
                        && n["alerts"][0]["labels"]["alertname"] == "ttft_p99_spike"
                })
            },
        )
        .await;

    // While firing, the alert is re-sent: Alertmanager's endsAt moves forward.
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        let again = find(&am.alerts().await, "al-1")
            .cloned()
            .expect("still listed while firing");
        // Counted once Alertmanager's answer is back, just after it lists the new endsAt.
        let sent = counter(&metrics, &receiver, "sent");
        if parse_time(&again["endsAt"]) > first_ends && sent >= 2.0 {
            break again;
        }
        assert!(
            Instant::now() < deadline,
            "no re-send moved endsAt within 10 s: {first_ends} -> {} ({sent} sent)\n{}",
            again["endsAt"],
            metrics.encode()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(again["status"]["state"], "active");

    // Resolved: Alertmanager no longer lists it as an alert (0.25 leaves resolved alerts out of
    // GET /api/v2/alerts) and tells its receiver it is resolved.
    let resolved = alert("al-1", AlertState::Resolved);
    notifier.notify(&resolved);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match find(&am.alerts().await, "al-1") {
            None => break,
            Some(a) => assert!(
                Instant::now() < deadline,
                "still listed after resolving: {a:#}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let notes = am_hook
        .wait_for(
            "Alertmanager's resolved notification",
            Duration::from_secs(10),
            |b| b.iter().any(|n| n["status"] == "resolved"),
        )
        .await;
    let note = notes.iter().find(|n| n["status"] == "resolved").unwrap();
    let ends = parse_time(&note["alerts"][0]["endsAt"]).timestamp_millis();
    assert_eq!(
        ends,
        resolved.resolved_at_unix_ms.unwrap(),
        "endsAt is our resolution time: {note:#}"
    );

    // Resolved alerts are not re-sent.
    let sent = counter(&metrics, &receiver, "sent");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        counter(&metrics, &receiver, "sent"),
        sent,
        "nothing re-sent after resolution"
    );
    assert_eq!(counter(&metrics, &receiver, "failed"), 0.0);
    assert_eq!(counter(&metrics, &receiver, "dropped"), 0.0);

    stop_tx.send(true).unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .expect("delivery task ends on shutdown")
            .unwrap();
    }
}

/// The incident id is the grouping key: a GPU leak and the latency it causes (two rules, two
/// label sets, one incident) reach Alertmanager as one group; another incident is another group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_incident_is_one_alertmanager_group() {
    let dir = tempfile::tempdir().unwrap();
    let (_hook, hook_url) = Hook::serve(0).await;
    let am = Alertmanager::start_grouped(dir.path(), &hook_url, "incident_id").await;
    let metrics = Arc::new(Metrics::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    let cfg = DeliveryConfig {
        alertmanagers: vec![am.url.clone()],
        resend_interval: HumanDuration(Duration::from_secs(1)),
        external_url: "http://127.0.0.1:9464".into(),
        ..Default::default()
    };
    let (notifier, tasks) = Notifier::start(cfg, metrics, stop_rx);
    let mut leak = alert("leak-1", AlertState::Firing);
    leak.rule = "gpu_memory_leak".into();
    leak.labels = BTreeMap::from([("device_id".into(), "GPU-0".into())]);
    leak.incident_id = Some("inc-7-1".into());
    let mut latency = alert("lat-1", AlertState::Firing);
    latency.incident_id = Some("inc-7-1".into());
    let mut other = alert("other-1", AlertState::Firing);
    other.labels.insert("model_id".into(), "m2".into());
    other.incident_id = Some("inc-9-2".into());
    for a in [&leak, &latency, &other] {
        notifier.notify(a);
    }
    let url = format!("{}/api/v2/alerts/groups", am.url);
    let deadline = Instant::now() + Duration::from_secs(10);
    let groups = loop {
        let r = common::get(&url).await;
        assert_eq!(r.status, 200, "{url}: {}", r.body);
        let groups = r.json().as_array().cloned().unwrap_or_default();
        let listed: usize = groups
            .iter()
            .map(|g| g["alerts"].as_array().map_or(0, Vec::len))
            .sum();
        if listed == 3 {
            break groups;
        }
        assert!(
            Instant::now() < deadline,
            "Alertmanager lists {listed} of 3 alerts: {groups:#?}\n{}",
            am.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut by_incident: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for g in &groups {
        let key = g["labels"]["incident_id"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let mut names: Vec<String> = g["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["labels"]["alertname"].as_str().map(str::to_string))
            .collect();
        names.sort();
        by_incident.entry(key).or_default().extend(names);
    }
    assert_eq!(
        by_incident,
        BTreeMap::from([
            (
                "inc-7-1".to_string(),
                vec!["gpu_memory_leak".to_string(), "ttft_p99_spike".to_string()]
            ),
            ("inc-9-2".to_string(), vec!["ttft_p99_spike".to_string()]),
        ]),
        "{groups:#?}"
    );
    stop_tx.send(true).unwrap();
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_get_documented_body_with_retries_and_isolation() {
    let (flaky, flaky_url) = Hook::serve(2).await;
    // A receiver that accepts connections and never answers, and one that refuses them.
    let black_hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let slow_url = format!("http://{}/hook", black_hole.local_addr().unwrap());
    // An address nobody listens on: that receiver's connections are refused.
    let dead: SocketAddr = common::free_addr();
    let metrics = Arc::new(Metrics::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    let cfg = DeliveryConfig {
        webhooks: vec![
            WebhookConfig {
                url: slow_url,
                headers: BTreeMap::new(),
                ..Default::default()
            },
            WebhookConfig {
                url: format!("http://{dead}/hook"),
                headers: BTreeMap::new(),
                ..Default::default()
            },
            WebhookConfig {
                url: flaky_url,
                headers: BTreeMap::from([("Authorization".into(), "Bearer s3cret".into())]),
                ..Default::default()
            },
        ],
        queue_capacity: 1,
        max_retries: 3,
        initial_backoff: HumanDuration(Duration::from_millis(50)),
        timeout: HumanDuration(Duration::from_secs(20)),
        external_url: "http://127.0.0.1:9464".into(),
        ..Default::default()
    };
    cfg.validate().unwrap();
    let (notifier, tasks) = Notifier::start(cfg, metrics.clone(), stop_rx);
    let names = notifier.receiver_names();
    let (slow, dead_name, flaky_name) = (&names[0], &names[1], &names[2]);

    // Firing: the flaky receiver answers 500 twice, then gets the documented body — long before
    // the silent receiver's 20 s timeout, so that one blocks nobody.
    let started = Instant::now();
    notifier.notify(&alert("al-2", AlertState::Firing));
    let got = flaky
        .wait_for("firing webhook", Duration::from_secs(10), |b| !b.is_empty())
        .await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        flaky.requests.load(Ordering::SeqCst),
        3,
        "two 500s, then success"
    );
    let body = &got[0];
    assert_eq!(body["version"], "1");
    assert_eq!(body["status"], "firing");
    assert_eq!(body["alert"]["id"], "al-2");
    assert_eq!(body["alert"]["state"], "firing");
    assert_eq!(body["alert"]["rule"], "ttft_p99_spike");
    assert_eq!(body["alert"]["root_cause"][0]["path"][0], "gpu_memory_leak");
    assert_eq!(body["url"], "http://127.0.0.1:9464/#/alerts/al-2");
    let sent_at = parse_time(&body["sent_at"]).timestamp_millis();
    assert!(
        (now_ms() - sent_at).abs() < 10_000,
        "sent_at is now: {}",
        body["sent_at"]
    );
    let headers = flaky.received.lock().unwrap()[0].0.clone();
    assert_eq!(headers["authorization"], "Bearer s3cret");
    assert_eq!(headers["content-type"], "application/json");

    // The refused receiver gave up after its retries; the silent one is still waiting.
    wait_counted(&metrics, dead_name, "failed", "the dead receiver").await;
    assert_eq!(counter(&metrics, flaky_name, "sent"), 1.0);
    assert_eq!(
        counter(&metrics, slow, "sent") + counter(&metrics, slow, "failed"),
        0.0
    );

    // Repeating the same state is not re-sent to webhooks.
    notifier.notify(&alert("al-2", AlertState::Firing));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(flaky.bodies().len(), 1);

    // Resolved reaches the flaky receiver; the silent receiver's queue (capacity 1) holds the
    // second notification and drops the third.
    let mut without_snapshot = alert("al-2", AlertState::Firing);
    without_snapshot.snapshot = None;
    notifier.notify(&without_snapshot);
    flaky
        .wait_for("second firing webhook", Duration::from_secs(10), |b| {
            b.len() == 2
        })
        .await;
    notifier.notify(&alert("al-2", AlertState::Resolved));
    let got = flaky
        .wait_for("resolved webhook", Duration::from_secs(10), |b| {
            b.len() == 3
        })
        .await;
    assert_eq!(got[2]["status"], "resolved");
    assert_eq!(got[2]["alert"]["state"], "resolved");
    assert_eq!(
        counter(&metrics, slow, "dropped"),
        1.0,
        "{}",
        metrics.encode()
    );
    let m = metrics.encode();
    assert!(
        m.contains(&format!(
            "tokenwatch_alert_queue_depth{{receiver=\"{slow}\"}} 1"
        )),
        "{m}"
    );
    assert!(
        m.contains(&format!(
            "tokenwatch_alert_notification_latency_seconds_count{{receiver=\"{flaky_name}\"}} 3"
        )),
        "{m}"
    );

    // Shutdown ends every task promptly, the one stuck on the silent receiver included.
    stop_tx.send(true).unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .expect("delivery task ends on shutdown")
            .unwrap();
    }
    drop(black_hole);
}

/// A CA (PEM) and a certificate for localhost and 127.0.0.1 it signed (chain, key).
fn test_pki() -> (
    String,
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "tokenwatch receiver test CA");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
        .unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(
        key.serialize_der(),
    ));
    (ca.pem(), vec![leaf.der().clone(), ca.der().clone()], key)
}

/// A TLS front on 127.0.0.1 (the certificate of `test_pki`) relaying each connection to the
/// plain receiver at `backend`: an https receiver with its own CA.
async fn tls_front(
    chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    key: rustls::pki_types::PrivateKeyDer<'static>,
    backend: SocketAddr,
) -> SocketAddr {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await else {
                    return;
                };
                let _ = plain.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    addr
}

fn authority(url: &str) -> SocketAddr {
    let rest = url.trim_start_matches("http://");
    rest.split('/').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_receivers_trusted_by_their_own_ca_get_alerts_and_an_untrusted_one_fails_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (ca_pem, chain, key) = test_pki();
    let ca_file = dir.path().join("receivers-ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    // A real Alertmanager and a webhook, each behind a TLS front with the test CA's certificate.
    let (am_hook, am_hook_url) = Hook::serve(0).await;
    let am = Alertmanager::start(dir.path(), &am_hook_url).await;
    let am_tls = tls_front(chain.clone(), key.clone_key(), authority(&am.url)).await;
    let (hook, hook_url) = Hook::serve(0).await;
    let hook_tls = tls_front(chain, key, authority(&hook_url)).await;
    let trusted = Some(tokenwatch::config::UpstreamTlsConfig {
        ca_file: Some(ca_file.clone()),
        ..Default::default()
    });
    let metrics = Arc::new(Metrics::new());
    let (stop_tx, stop_rx) = watch::channel(false);
    let cfg = DeliveryConfig {
        alertmanagers: vec![format!("https://{am_tls}")],
        alertmanager_tls: trusted.clone(),
        webhooks: vec![
            // Named by host: the certificate holds localhost.
            WebhookConfig {
                url: format!("https://localhost:{}/hook", hook_tls.port()),
                headers: BTreeMap::from([("Authorization".into(), "Bearer s3cret".into())]),
                tls: trusted,
                ..Default::default()
            },
            // The same receiver with the system's roots only: its certificate is not trusted.
            WebhookConfig {
                url: format!("https://127.0.0.1:{}/hook", hook_tls.port()),
                ..Default::default()
            },
        ],
        max_retries: 1,
        initial_backoff: HumanDuration(Duration::from_millis(50)),
        external_url: "http://127.0.0.1:9464".into(),
        ..Default::default()
    };
    cfg.validate().unwrap();
    let (notifier, tasks) = Notifier::start(cfg, metrics.clone(), stop_rx);
    let names = notifier.receiver_names();
    let (am_name, trusted_name, untrusted_name) = (&names[0], &names[1], &names[2]);

    notifier.notify(&alert("al-tls", AlertState::Firing));
    let got = hook
        .wait_for("webhook over https", Duration::from_secs(10), |b| {
            !b.is_empty()
        })
        .await;
    assert_eq!(got[0]["alert"]["id"], "al-tls");
    assert_eq!(
        hook.received.lock().unwrap()[0].0["authorization"],
        "Bearer s3cret"
    );
    wait_listed(&am, "al-tls").await;
    // The untrusted receiver: the handshake fails, is retried once, and counted failed.
    wait_counted(&metrics, untrusted_name, "failed", "the untrusted receiver").await;
    assert_eq!(counter(&metrics, untrusted_name, "sent"), 0.0);
    assert_eq!(counter(&metrics, trusted_name, "sent"), 1.0);
    assert_eq!(counter(&metrics, am_name, "sent"), 1.0);
    assert_eq!(
        hook.bodies().len(),
        1,
        "only the trusted webhook got through"
    );
    drop(am_hook);

    stop_tx.send(true).unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .expect("delivery task ends on shutdown")
            .unwrap();
    }
}

/// Slack, Teams and PagerDuty receivers get their own bodies: nothing while pending, one message
/// when the alert fires (not another when its snapshot link appears), one when it resolves;
/// PagerDuty triggers and resolves one incident by the alert's fingerprint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_teams_and_pagerduty_receivers_get_their_own_bodies_once_per_state() {
    let (slack, slack_url) = Hook::serve(0).await;
    let (teams, teams_url) = Hook::serve(0).await;
    let (pd, pd_url) = Hook::serve(0).await;
    let hook = |url: &str, format| WebhookConfig {
        url: url.into(),
        format,
        routing_key: (format == WebhookFormat::Pagerduty).then(|| "R0UT1NG-KEY".into()),
        ..Default::default()
    };
    let cfg = DeliveryConfig {
        webhooks: vec![
            hook(&slack_url, WebhookFormat::Slack),
            hook(&teams_url, WebhookFormat::Teams),
            hook(&pd_url, WebhookFormat::Pagerduty),
        ],
        external_url: "https://tw.example".into(),
        ..Default::default()
    };
    cfg.validate().unwrap();
    let (stop_tx, stop_rx) = watch::channel(false);
    let (notifier, tasks) = Notifier::start(cfg, Arc::new(Metrics::new()), stop_rx);

    let mut pending = alert("al-9", AlertState::Pending);
    pending.snapshot = None;
    notifier.notify(&pending);
    let mut firing = alert("al-9", AlertState::Firing);
    firing.snapshot = None;
    notifier.notify(&firing);
    // The snapshot link appears: tokenwatch's own webhook would be told, a chat is not.
    notifier.notify(&alert("al-9", AlertState::Firing));
    let one = |b: &[serde_json::Value]| b.len() == 1;
    let s = slack
        .wait_for("slack firing", Duration::from_secs(10), one)
        .await;
    let t = teams
        .wait_for("teams firing", Duration::from_secs(10), one)
        .await;
    let p = pd
        .wait_for("pagerduty trigger", Duration::from_secs(10), one)
        .await;
    let text = s[0]["blocks"][0]["text"]["text"].as_str().unwrap();
    assert!(
        text.starts_with("*[FIRING:critical] ttft_p99_spike on m1 / 10.0.0.7:8000*"),
        "{text}"
    );
    assert!(
        text.contains("<https://tw.example/#/alerts/al-9|Open in tokenwatch>"),
        "{text}"
    );
    assert_eq!(
        t[0]["attachments"][0]["content"]["type"], "AdaptiveCard",
        "{}",
        t[0]
    );
    assert_eq!(p[0]["event_action"], "trigger");
    assert_eq!(p[0]["routing_key"], "R0UT1NG-KEY");
    assert_eq!(p[0]["dedup_key"], "fp-al-9");
    assert_eq!(p[0]["payload"]["severity"], "critical");
    assert_eq!(p[0]["payload"]["source"], "10.0.0.7:8000");

    notifier.notify(&alert("al-9", AlertState::Resolved));
    let two = |b: &[serde_json::Value]| b.len() == 2;
    let s = slack
        .wait_for("slack resolved", Duration::from_secs(10), two)
        .await;
    teams
        .wait_for("teams resolved", Duration::from_secs(10), two)
        .await;
    let p = pd
        .wait_for("pagerduty resolve", Duration::from_secs(10), two)
        .await;
    assert!(
        s[1]["text"]
            .as_str()
            .unwrap()
            .starts_with("[RESOLVED:critical]"),
        "{}",
        s[1]
    );
    assert_eq!(
        (&p[1]["event_action"], &p[1]["dedup_key"]),
        (&serde_json::json!("resolve"), &serde_json::json!("fp-al-9"))
    );
    // Nothing more arrives (no pending, no snapshot repeat).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        (
            slack.bodies().len(),
            teams.bodies().len(),
            pd.bodies().len()
        ),
        (2, 2, 2)
    );
    stop_tx.send(true).unwrap();
    for t in tasks {
        let _ = t.await;
    }
}
