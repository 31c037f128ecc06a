// The web UI in a real browser: starts `tokenwatch demo` on free ports with a GPU-memory leak
// switched on early, checks the embedded assets over HTTP, then runs ui/tests/browser.mjs
// (Playwright driving Debian's headless Chromium, sending OTLP spans to the demo's OTLP/HTTP
// port for the trace waterfall), which writes screenshots to target/ui-artifacts.

use crate::common;

use common::{get, start_demo_with_leak};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHROMIUM: &str = "/usr/bin/chromium";
/// The whole browser run (data, the fault's alert, every page) must finish within this.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(300);
/// When the demo switches its kv_leak fault on (early, so the test is short), and on which model.
const FAULT_AFTER: Duration = Duration::from_secs(20);
const FAULTED_MODEL: &str = "llama-3.1-8b-instruct";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Node, the locked playwright-core and the system Chromium; a missing one fails the test.
fn require_tools(ui: &Path) {
    let node = Command::new("node").arg("--version").output();
    assert!(
        node.as_ref().is_ok_and(|o| o.status.success()),
        "node is not installed ({node:?}) — install Node.js (Debian: apt-get install nodejs npm) and run scripts/test.sh"
    );
    assert!(
        ui.join("node_modules/playwright-core/package.json")
            .is_file(),
        "ui/node_modules/playwright-core is missing — run `npm ci` in ui/ (scripts/test.sh does it)"
    );
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing — install Debian's chromium (apt-get install chromium; scripts/test.sh does it)"
    );
}

#[tokio::test]
async fn web_ui_pages_work_in_headless_chromium() {
    let root = repo_root();
    let ui = root.join("ui");
    require_tools(&ui);

    let dir = tempfile::tempdir().unwrap();
    // The fault switches on FAULT_AFTER after the demo starts: alerts older than that are not its.
    let not_before_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
        + FAULT_AFTER.as_millis() as u64;
    let (demo, api, otlp_http) =
        start_demo_with_leak(dir.path(), &format!("{}s", FAULT_AFTER.as_secs())).await;

    // The assets are in the binary and served with their types; unknown ones are 404.
    let index = get(&format!("http://{api}/")).await;
    assert_eq!(index.status, 200);
    assert!(
        index.headers["content-type"]
            .to_str()
            .unwrap_or("")
            .starts_with("text/html")
    );
    assert!(index.body.contains("/ui/app.js"), "{}", index.body);
    for (path, ctype) in [
        ("/ui/app.js", "text/javascript"),
        ("/ui/pages/model.js", "text/javascript"),
        ("/ui/pages/slos.js", "text/javascript"),
        ("/ui/vendor/uPlot.iife.min.js", "text/javascript"),
        ("/ui/vendor/uPlot.min.css", "text/css"),
        ("/ui/vendor/uPlot.LICENSE", "text/plain"),
    ] {
        let r = get(&format!("http://{api}{path}")).await;
        assert_eq!(r.status, 200, "{path}");
        assert!(
            r.headers["content-type"]
                .to_str()
                .unwrap_or("")
                .starts_with(ctype),
            "{path}: {:?}",
            r.headers["content-type"]
        );
        assert!(
            r.headers.contains_key("cache-control") && r.headers.contains_key("etag"),
            "{path}: {:?}",
            r.headers
        );
    }
    assert_eq!(
        get(&format!("http://{api}/ui/no-such.js")).await.status,
        404
    );
    assert_eq!(
        get(&format!("http://{api}/api/v1/no-such")).await.status,
        404,
        "the API's own 404 still answers"
    );

    let out = root.join("target/ui-artifacts");
    let _ = std::fs::remove_dir_all(&out);
    let base = format!("http://{api}");
    let otlp_http = otlp_http.to_string();
    let run = tokio::task::spawn_blocking(move || {
        run_browser(&ui, &base, &out, not_before_ms, &otlp_http)
    })
    .await
    .unwrap();
    let (ok, output) = run;
    assert!(
        ok,
        "browser test failed:\n{output}\n--- demo log (tail) ---\n{}",
        tail(&demo.log(), 60)
    );
    println!("{output}");
}

/// Runs `node ui/tests/browser.mjs BASE OUT` in its own process group, killing the group (node
/// and the Chromium it started) after BROWSER_TIMEOUT. The test sends OTLP spans for the trace
/// waterfall to `otlp_http`.
fn run_browser(
    ui: &Path,
    base: &str,
    out: &Path,
    not_before_ms: u64,
    otlp_http: &str,
) -> (bool, String) {
    let log_path = out.with_extension("log");
    let _ = std::fs::create_dir_all(out);
    let log = std::fs::File::create(&log_path).expect("create the browser log");
    let mut child = Command::new("node")
        .arg(ui.join("tests/browser.mjs"))
        .arg(base)
        .arg(out)
        .env("UI_TEST_MODEL", FAULTED_MODEL)
        .env("UI_TEST_NOT_BEFORE_MS", not_before_ms.to_string())
        .env("UI_TEST_OTLP_HTTP", otlp_http)
        .stdout(Stdio::from(log.try_clone().expect("clone log handle")))
        .stderr(Stdio::from(log))
        .process_group(0)
        .spawn()
        .expect("starting node");
    let deadline = Instant::now() + BROWSER_TIMEOUT;
    let status = loop {
        if let Ok(Some(s)) = child.try_wait() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(format!("-{}", child.id()))
                .status();
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    match status {
        Some(s) => (s.success(), output),
        None => (
            false,
            format!("{output}\n(killed after {BROWSER_TIMEOUT:?})"),
        ),
    }
}

fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}
