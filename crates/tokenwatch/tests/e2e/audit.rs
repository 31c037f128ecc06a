// The audit log through the real binary: one JSON line per API request and refused attempt with
// the caller, role, status and bytes; token reloads as events; no token anywhere (query strings
// redacted); anonymous callers without tokens; expired day files deleted at start.

use crate::auth_support;
use crate::common;

use auth_support::{ADMIN, INGEST, READ, READ2, UNKNOWN, call};
use common::{Proc, metric_value, start_collector, write_auth_files};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

/// Every line of every day file in `dir`, in file order.
fn audit_text(dir: &Path) -> String {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect()
}

fn lines(dir: &Path) -> Vec<Value> {
    audit_text(dir)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Wait (flush interval: 1 s) until `dir`'s lines satisfy `done`.
async fn wait_for(
    dir: &Path,
    tw: &Proc,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = lines(dir);
        if done(&got) {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the audit log never got there:\n{}\nlog:\n{}",
            audit_text(dir),
            tw.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// (method, path and query, token, status, caller, role)
type Case = (
    &'static str,
    &'static str,
    Option<&'static str>,
    u16,
    &'static str,
    Option<&'static str>,
);

fn requests(lines: &[Value]) -> Vec<&Value> {
    lines.iter().filter(|l| l.get("path").is_some()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_refusals_and_reloads_are_audited_without_any_token() {
    let dir = tempfile::tempdir().unwrap();
    // A named read token, unnamed admin (line 3) and ingest (line 4) tokens.
    let (tokens, file) = write_auth_files(
        dir.path(),
        &format!("# who\nread {READ} grafana\nadmin {ADMIN}\ningest {INGEST}\n"),
    );
    let audit = dir.path().join("data").join("audit");
    let (mut tw, api) = start_collector(dir.path(), &["-c", &file.to_string_lossy()]).await;

    let base = format!("http://{api}");
    let cases: [Case; 6] = [
        (
            "GET",
            "/api/v1/fleet",
            Some(READ),
            200,
            "grafana",
            Some("read"),
        ),
        (
            "GET",
            "/api/v1/requests?model=m&limit=5",
            Some(ADMIN),
            200,
            "admin#3",
            Some("admin"),
        ),
        (
            "GET",
            "/metrics?token=abc",
            Some(READ),
            200,
            "grafana",
            Some("read"),
        ),
        ("GET", "/api/v1/alerts", None, 401, "anonymous", None),
        (
            "GET",
            "/api/v1/fleet?limit=1",
            Some(UNKNOWN),
            401,
            "unknown-token",
            None,
        ),
        (
            "POST",
            "/api/v1/embeddings",
            Some(READ),
            403,
            "grafana",
            Some("read"),
        ),
    ];
    let mut sizes = Vec::new();
    for (method, target, token, status, ..) in cases {
        let body = (method == "POST").then_some(r#"{"items":[]}"#);
        let reply = call(method, &format!("{base}{target}"), body, token).await;
        assert_eq!(reply.status, status, "{method} {target}: {}", reply.body);
        sizes.push(reply.body.len() as u64);
    }
    // Open routes (probes, UI assets) are not audited.
    assert_eq!(
        call("GET", &format!("{base}/healthz"), None, None)
            .await
            .status,
        200
    );
    assert_eq!(
        call("GET", &format!("{base}/ui/app.js"), None, None)
            .await
            .status,
        200
    );

    let got = wait_for(&audit, &tw, "six request lines", |l| requests(l).len() >= 6).await;
    let reqs = requests(&got);
    assert_eq!(reqs.len(), 6, "{}", audit_text(&audit));
    for (((method, target, _, status, caller, role), size), line) in
        cases.iter().zip(&sizes).zip(&reqs)
    {
        let (path, query) = target
            .split_once('?')
            .map_or((*target, None), |(p, q)| (p, Some(q)));
        assert_eq!(line["method"], *method, "{line}");
        assert_eq!(line["path"], path, "{line}");
        let want_query = query.map(|q| q.replace("token=abc", "token=REDACTED"));
        assert_eq!(line["query"].as_str(), want_query.as_deref(), "{line}");
        assert_eq!(line["status"], *status, "{line}");
        assert_eq!(line["caller"], *caller, "{line}");
        assert_eq!(line["role"].as_str(), *role, "{line}");
        assert_eq!(line["bytes"].as_u64(), Some(*size), "{line}");
        assert!(line["bytes"].as_u64() > Some(0), "{line}");
        assert!(
            line["duration_ms"].as_f64().is_some_and(|d| d >= 0.0),
            "{line}"
        );
        assert!(
            line["remote"]
                .as_str()
                .is_some_and(|r| r.starts_with("127.0.0.1:")),
            "{line}"
        );
        let ts = line["ts"].as_str().unwrap();
        assert!(
            chrono::DateTime::parse_from_rfc3339(ts).is_ok() && ts.ends_with('Z') && ts.len() == 24,
            "{line}"
        );
    }
    // Each line is in the file of its own (UTC) day.
    let day = reqs[0]["ts"].as_str().unwrap()[..10].to_string();
    assert!(audit.join(format!("audit-{day}.jsonl")).is_file());

    // A token file rewrite is a configuration change; so is a failed one.
    std::fs::write(
        &tokens,
        format!("read {READ2} grafana\nadmin {ADMIN} ops\n"),
    )
    .unwrap();
    let t = tokens.display().to_string();
    let reloaded = |l: &[Value]| {
        l.iter().any(|v| {
            v["event"] == "auth_tokens_reloaded" && v["tokens"] == 2 && v["file"] == t.as_str()
        })
    };
    wait_for(&audit, &tw, "reload event", reloaded).await;
    assert_eq!(
        call("GET", &format!("{base}/api/v1/fleet"), None, Some(ADMIN))
            .await
            .status,
        200
    );
    std::fs::write(&tokens, format!("read {READ2}\nread {READ2}\n")).unwrap();
    let failed = |l: &[Value]| {
        l.iter().any(|v| {
            v["event"] == "auth_tokens_reload_failed"
                && v["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("already listed on line 1"))
        })
    };
    let got = wait_for(&audit, &tw, "failed reload event", failed).await;
    // The admin token is now named `ops`.
    assert!(
        requests(&got)
            .iter()
            .any(|l| l["caller"] == "ops" && l["role"] == "admin"),
        "{}",
        audit_text(&audit)
    );

    let metrics = call("GET", &format!("{base}/metrics"), None, Some(ADMIN))
        .await
        .body;
    assert_eq!(
        metric_value(&metrics, "tokenwatch_audit_dropped_total"),
        Some(0.0),
        "{metrics}"
    );
    assert!(tw.terminate().success(), "{}", tw.log());
    // Flushed at shutdown: the last /metrics call is there.
    let text = audit_text(&audit);
    let last = lines(&audit)
        .into_iter()
        .rev()
        .find(|l| l.get("path").is_some())
        .unwrap();
    assert_eq!(
        (last["path"].as_str(), last["caller"].as_str()),
        (Some("/metrics"), Some("ops")),
        "{text}"
    );
    for token in [READ, ADMIN, INGEST, UNKNOWN, READ2, "token=abc", "Bearer"] {
        assert!(
            !text.contains(token),
            "the audit log contains {token:?}:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_callers_are_anonymous_and_expired_files_go_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let audit = data.join("audit");
    std::fs::create_dir_all(&audit).unwrap();
    let today = chrono::Utc::now().date_naive();
    let name = |days: i64| {
        let day = today - chrono::Duration::days(days);
        format!("audit-{}.jsonl", day.format("%Y-%m-%d"))
    };
    let (old, recent) = (audit.join(name(40)), audit.join(name(5)));
    std::fs::write(&old, "{\"ts\":\"old\"}\n").unwrap();
    std::fs::write(&recent, "{\"ts\":\"recent\"}\n").unwrap();
    let (mut tw, api) = start_collector(dir.path(), &[]).await;
    assert!(
        !old.exists(),
        "a file of 40 days ago survived the 30d retention"
    );
    assert!(recent.exists(), "a file of 5 days ago was deleted");

    let reply = call("GET", &format!("http://{api}/api/v1/fleet"), None, None).await;
    assert_eq!(reply.status, 200);
    let got = wait_for(&audit, &tw, "anonymous line", |l| !requests(l).is_empty()).await;
    let line = requests(&got)[0].clone();
    assert_eq!(line["caller"], "anonymous", "{line}");
    assert_eq!(line["role"], Value::Null, "{line}");
    assert_eq!(
        line["bytes"].as_u64(),
        Some(reply.body.len() as u64),
        "{line}"
    );
    assert!(
        line["remote"]
            .as_str()
            .is_some_and(|r| r.starts_with("127.0.0.1:")),
        "{line}"
    );
    assert!(tw.terminate().success(), "{}", tw.log());
}

/// 5,000 requests without a token (the issue's attack: 20.9 MB of audit log in 0.9 s) write
/// their first refusal whole and the rest as one `requests_refused` line with its count; the
/// authorised requests around them are each written whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_refused_requests_is_folded_into_one_line_with_a_count() {
    const FLOOD: usize = 5000;
    let dir = tempfile::tempdir().unwrap();
    let (_, file) = write_auth_files(dir.path(), &format!("read {READ} grafana\n"));
    let audit = dir.path().join("data").join("audit");
    let (mut tw, api) = start_collector(dir.path(), &["-c", &file.to_string_lossy()]).await;
    let base = format!("http://{api}");
    let fleet = format!("{base}/api/v1/fleet");
    assert_eq!(call("GET", &fleet, None, Some(READ)).await.status, 200);
    let started = Instant::now();
    let url = format!("{base}/metrics");
    let mut refused = 0;
    for batch in 0..FLOOD / 50 {
        let calls = (0..50).map(|_| call("GET", &url, None, None));
        for r in futures_util::future::join_all(calls).await {
            assert_eq!(r.status, 401, "batch {batch}: {}", r.body);
            refused += 1;
        }
    }
    assert_eq!(refused, FLOOD);
    let flood_took = started.elapsed();
    assert_eq!(call("GET", &fleet, None, Some(READ)).await.status, 200);
    assert!(tw.terminate().success(), "{}", tw.log());

    let text = audit_text(&audit);
    let got = lines(&audit);
    let whole: Vec<&Value> = got
        .iter()
        .filter(|l| l["status"] == 401 && l.get("event").is_none())
        .collect();
    let folded: Vec<&Value> = got
        .iter()
        .filter(|l| l["event"] == "requests_refused")
        .collect();
    assert_eq!(whole.len(), 1, "{text}");
    assert_eq!(folded.len(), 1, "{text}");
    let f = folded[0];
    assert_eq!(f["count"].as_u64(), Some(FLOOD as u64 - 1), "{f}");
    assert_eq!(
        (
            f["remote"].as_str(),
            f["caller"].as_str(),
            f["method"].as_str(),
            f["path"].as_str()
        ),
        (
            Some("127.0.0.1"),
            Some("anonymous"),
            Some("GET"),
            Some("/metrics")
        ),
        "{f}"
    );
    let read_ok = got.iter().filter(|l| l["caller"] == "grafana").count();
    assert_eq!(read_ok, 2, "{text}");
    // A handful of lines instead of one a request (the flood took {flood_took:?}).
    assert!(
        text.len() < 4096,
        "{} bytes after {flood_took:?}:\n{text}",
        text.len()
    );
}
