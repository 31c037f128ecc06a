// Tests of configuration reload (reload.rs): what a changed file applies, what needs a restart,
// and what a bad file leaves untouched.

use super::*;

fn cfg(yaml: &str) -> Config {
    Config::from_yaml(yaml, "t.yaml").unwrap()
}

const ALL: Running = Running {
    proxy: true,
    engine: true,
    scrape: true,
    replica: false,
};

#[test]
fn changed_keys_follow_struct_fields_down() {
    let a = cfg("listen: 127.0.0.1:9000\nstore:\n  raw_retention: 2d\n");
    let b = cfg(
        "listen: 127.0.0.1:9001\nstore:\n  raw_retention: 3d\n  clickhouse:\n    database: x\n",
    );
    assert_eq!(
        changed_keys(&a, &b),
        ["listen", "store.clickhouse.database", "store.raw_retention"]
    );
    assert!(changed_keys(&a, &a.clone()).is_empty());
    let up = |m: &str| {
        cfg(&format!(
            "proxy:\n  upstreams:\n    - url: http://127.0.0.1:1\n      models: [{m}]\n"
        ))
    };
    assert_eq!(changed_keys(&up("a"), &up("b")), ["proxy.upstreams"]);
}

#[test]
fn the_same_file_read_twice_changes_nothing() {
    let y = "proxy:\n  upstreams:\n    - {url: 'http://127.0.0.1:1', models: [a]}\nalerting:\n  rules:\n    - {name: r, detector: threshold, signal: kv_cache_usage, params: {op: '>', value: 0.9}}\n  delivery:\n    webhooks:\n      - {url: 'http://127.0.0.1:2/h', headers: {a: '1', b: '2', c: '3', d: '4'}}\nscrape:\n  targets:\n    - {url: 'http://127.0.0.1:3/metrics', labels: {x: '1', y: '2'}}\n";
    let p = plan(&cfg(y), &cfg(y), ALL).unwrap();
    assert_eq!(p.outcome.applied, Vec::<&str>::new());
    assert_eq!(p.outcome.restart_required, Vec::<String>::new());
    assert_eq!(p.outcome.unchanged, RELOADABLE);
    assert!(p.routes.is_none() && p.engine.is_none() && p.targets.is_none());
}

#[test]
fn reloadable_sections_apply_and_the_rest_waits_for_a_restart() {
    let old = cfg("proxy:\n  upstreams:\n    - {url: 'http://127.0.0.1:1', models: [a]}\n");
    let new = cfg(concat!(
        "listen: 127.0.0.1:9999\n",
        "proxy:\n  upstreams:\n    - {url: 'http://127.0.0.1:2', models: [a]}\n",
        "alerting:\n  resolve_after: 1m\n  incident_window: 1m\n",
        "  rules:\n    - {name: kv_high, detector: threshold, signal: kv_cache_usage, params: {op: '>', value: 0.9}}\n",
        "scrape:\n  targets:\n    - {url: 'http://127.0.0.1:3/metrics'}\n",
    ));
    let p = plan(&old, &new, ALL).unwrap();
    assert_eq!(
        p.outcome.applied,
        ["proxy.upstreams", "alerting", "scrape.targets"]
    );
    assert_eq!(
        p.outcome.restart_required,
        ["alerting.incident_window", "listen"]
    );
    assert_eq!(p.outcome.unchanged, ["proxy.routes", "slos"]);
    // The running values stay for what needs a restart.
    assert_eq!(p.merged.listen, old.listen);
    assert_eq!(
        p.merged.alerting.incident_window,
        old.alerting.incident_window
    );
    assert_eq!(p.merged.alerting.resolve_after, new.alerting.resolve_after);
    let routes = p.routes.as_ref().unwrap();
    assert_eq!(routes.route(Some("a")).unwrap().0.instance, "127.0.0.1:2");
    let e = p.engine.as_ref().unwrap();
    assert!(e.rules.iter().any(|r| r.name == "kv_high"));
    // Default rules are untouched: they keep their state; the new rule is new.
    for (r, same) in e.rules.iter().zip(&e.unchanged) {
        assert_eq!(*same, r.name != "kv_high", "{}", r.name);
    }
    assert!(e.slos.is_none());
    // Snapshots show the configuration that runs now.
    let json = e.config_json.as_ref().unwrap();
    assert_eq!(json["format"], "json", "{json:#}");
    let shown = json["config"].to_string();
    assert!(
        shown.contains("http://127.0.0.1:2") && shown.contains("kv_high"),
        "{shown}"
    );
    assert!(!shown.contains("127.0.0.1:9999"), "{shown}");
    assert_eq!(p.targets.as_ref().unwrap().len(), 1);
    // Reloading the merged configuration again reports only what still waits.
    let again = plan(&p.merged, &new, ALL).unwrap();
    assert!(again.outcome.applied.is_empty());
    assert_eq!(
        again.outcome.restart_required,
        ["alerting.incident_window", "listen"]
    );
}

#[test]
fn parts_that_do_not_run_need_a_restart() {
    let old = cfg("");
    let new = cfg(
        "proxy:\n  upstreams:\n    - {url: 'http://127.0.0.1:2'}\nslos: []\nscrape:\n  targets:\n    - {url: 'http://127.0.0.1:3/metrics'}\n",
    );
    let p = plan(&old, &new, Running::default()).unwrap();
    assert!(p.outcome.applied.is_empty());
    assert_eq!(
        p.outcome.restart_required,
        ["proxy.upstreams", "scrape.targets", "slos"]
    );
    assert_eq!(p.outcome.unchanged, ["proxy.routes", "alerting"]);
    let p = plan(
        &old,
        &new,
        Running {
            engine: true,
            ..Running::default()
        },
    )
    .unwrap();
    assert_eq!(p.outcome.applied, ["slos"]);
    assert_eq!(
        p.engine
            .as_ref()
            .and_then(|e| e.slos.as_ref())
            .map(Vec::len),
        Some(0)
    );
}

#[test]
fn a_routes_only_reload_keeps_every_rule() {
    let up = |port: u16| {
        cfg(&format!(
            "proxy:\n  upstreams:\n    - {{url: 'http://127.0.0.1:{port}'}}\n"
        ))
    };
    let p = plan(&up(1), &up(2), ALL).unwrap();
    assert_eq!(p.outcome.applied, ["proxy.upstreams"]);
    let e = p.engine.unwrap();
    assert!(!e.rules.is_empty() && e.unchanged.iter().all(|same| *same));
    assert!(e.slos.is_none() && e.config_json.is_some());
}

#[test]
fn an_override_change_renews_only_its_rule() {
    let old = cfg("");
    let new = cfg("alerting:\n  overrides:\n    latency_spike: {for: 1m}\n");
    let p = plan(&old, &new, ALL).unwrap();
    let e = p.engine.unwrap();
    let renewed: Vec<&str> = e
        .rules
        .iter()
        .zip(&e.unchanged)
        .filter(|(_, s)| !**s)
        .map(|(r, _)| r.name.as_str())
        .collect();
    assert_eq!(renewed, ["latency_spike"]);
}

#[tokio::test]
async fn a_bad_file_changes_nothing_and_no_file_is_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tw.yaml");
    std::fs::write(
        &file,
        "proxy:\n  upstreams:\n    - {url: 'http://127.0.0.1:1'}\n",
    )
    .unwrap();
    let running = Config::load(&file).unwrap();
    let f = file.clone();
    let source = ConfigSource {
        file: file.clone(),
        load: Arc::new(move || Ok(Config::load(&f)?)),
    };
    let metrics = Metrics::new();
    let handles = Handles {
        proxy: None,
        engine: None,
        hooks: Hooks::default(),
        audit: AuditLog::default(),
        replica: false,
    };
    let r = Reloader::new(Some(source), running, handles, &metrics);
    std::fs::write(&file, "proxy:\n  upstreams:\n    - {url: 'ftp://x'}\n").unwrap();
    let err = r.reload(Trigger::Api).await.unwrap_err().to_string();
    assert!(
        err.contains("tw.yaml") && err.contains("proxy.upstreams[0].url"),
        "{err}"
    );
    let text = metrics.encode();
    assert!(
        text.contains("tokenwatch_config_last_reload_successful 0"),
        "{text}"
    );
    assert!(
        text.contains("tokenwatch_config_reloads_total{result=\"failure\"} 1"),
        "{text}"
    );
    std::fs::write(
        &file,
        "listen: 127.0.0.1:1\nproxy:\n  upstreams:\n    - {url: 'http://127.0.0.1:1'}\n",
    )
    .unwrap();
    let ok = r.reload(Trigger::Sighup).await.unwrap();
    // No proxy runs here: only the listen key is reported.
    assert_eq!(ok.restart_required, ["listen"]);
    assert!(
        metrics
            .encode()
            .contains("tokenwatch_config_last_reload_successful 1")
    );

    let handles = Handles {
        proxy: None,
        engine: None,
        hooks: Hooks::default(),
        audit: AuditLog::default(),
        replica: false,
    };
    let none = Reloader::new(None, Config::default(), handles, &Metrics::new());
    assert!(matches!(
        none.reload(Trigger::Api).await,
        Err(ReloadError::NoFile)
    ));
}

#[test]
fn changed_routes_build_new_splits_and_bad_ones_are_refused() {
    let ups = "proxy:\n  upstreams:\n    - {url: 'http://127.0.0.1:1', instance: a}\n    - {url: 'http://127.0.0.1:2', instance: b}\n";
    let old = cfg(ups);
    let new = cfg(&format!(
        "{ups}  routes:\n    - name: r\n      model: m\n      split: [{{upstream: a, version: v1, weight: 9}}, {{upstream: b, version: v2, weight: 1}}]\n"
    ));
    let p = plan(&old, &new, ALL).unwrap();
    assert_eq!(p.outcome.applied, ["proxy.routes"]);
    let routes = p.routes.as_ref().unwrap();
    assert_eq!(routes.splits().len(), 1);
    assert_eq!(
        routes.splits()[0].weights(),
        [("v1".to_string(), 9.0), ("v2".to_string(), 1.0)]
    );
    let (_, _, version) = routes.route_for(Some("m"), "").unwrap();
    assert!(matches!(version, Some("v1" | "v2")));
    let bad = cfg(&format!(
        "{ups}  routes:\n    - name: r\n      model: m\n      split: [{{upstream: c, version: v1, weight: 1}}]\n"
    ));
    let e = plan(&old, &bad, ALL).err().unwrap();
    assert!(e.contains("proxy.routes[0].split[0].upstream"), "{e}");
}

#[test]
fn a_replica_applies_its_routes_and_reports_the_aggregators_sections_as_not_used() {
    let old = cfg(
        "role: proxy\nproxy:\n  tenant_salt: s\n  upstreams:\n    - {url: 'http://127.0.0.1:1', models: [a]}\naggregator: {endpoint: 'http://127.0.0.1:4318'}\n",
    );
    let new = cfg(
        "role: proxy\nproxy:\n  tenant_salt: s\n  upstreams:\n    - {url: 'http://127.0.0.1:1', models: [a, b]}\naggregator: {endpoint: 'http://127.0.0.1:4318'}\nlimits: {max_headers: 64}\nalerting: {evaluation_interval: 3s}\nstore: {raw_retention: 3d}\nexport: {prometheus: {tenant_label: true}}\n",
    );
    let replica = Running {
        proxy: true,
        replica: true,
        ..Running::default()
    };
    let p = plan(&old, &new, replica).unwrap();
    assert_eq!(p.outcome.applied, ["proxy.upstreams"]);
    assert_eq!(p.outcome.restart_required, ["limits.max_headers"]);
    assert_eq!(
        p.outcome.not_used,
        [
            "alerting.evaluation_interval",
            "export.prometheus.tenant_label",
            "store.raw_retention"
        ]
    );
    assert_eq!(p.outcome.unchanged, ["proxy.routes"]);
    assert!(p.routes.is_some() && p.engine.is_none());
    assert_eq!(p.merged.proxy.upstreams[0].models, ["a", "b"]);
    // role: all reports the same keys as needing a restart (it reads them).
    let all = Running {
        proxy: true,
        ..Running::default()
    };
    let p = plan(&old, &new, all).unwrap();
    assert!(p.outcome.not_used.is_empty());
    assert_eq!(p.outcome.restart_required.len(), 4, "{:?}", p.outcome);
    let json = serde_json::to_value(&p.outcome).unwrap();
    assert!(json.get("not_used").is_none(), "{json}");
}
