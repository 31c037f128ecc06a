// `tokenwatch top` against a real `tokenwatch demo` with traffic: the view runs inside tmux on a
// private socket, is read back with capture-pane and driven with send-keys (sort, filter, quit).

use crate::common;

use common::{BIN, free_addr, send, start_demo};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const LLAMA: &str = "llama-3.1-8b-instruct";
const QWEN: &str = "qwen2.5-14b-instruct";

/// A tmux server on a private socket, running one session named `top`; killed when dropped.
struct Tmux {
    socket: String,
    config: String,
    /// Where the shell around `top` writes its exit status.
    exit_file: std::path::PathBuf,
}

impl Tmux {
    /// Runs `top_args` (arguments of `tokenwatch`) in a 200x50 pane.
    fn start(dir: &Path, top_args: &str) -> Tmux {
        static N: AtomicUsize = AtomicUsize::new(0);
        match Command::new("tmux").arg("-V").output() {
            Ok(o) if o.status.success() => {}
            _ => panic!(
                "tmux is not installed — run the README's test command (scripts/test.sh), which installs Debian's `tmux`"
            ),
        }
        let config = dir.join("tmux.conf");
        // Keep the pane after `top` exits, to read the restored screen.
        std::fs::write(&config, "set -g remain-on-exit on\nset -g status off\n")
            .expect("write tmux.conf");
        let tmux = Tmux {
            socket: format!(
                "tw-top-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ),
            config: config.to_string_lossy().into_owned(),
            exit_file: dir.join("top.exit"),
        };
        // tmux's own #{pane_dead_status} is sometimes left empty, so a shell records the status.
        let command = format!(
            "'{BIN}' {top_args}; echo $? > '{}'",
            tmux.exit_file.display()
        );
        let out = tmux.run(&[
            "new-session",
            "-d",
            "-s",
            "top",
            "-x",
            "200",
            "-y",
            "50",
            &command,
        ]);
        assert!(
            out.status.success(),
            "tmux new-session failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tmux
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.socket, "-f", &self.config])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running tmux {args:?}: {e}"))
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "top"];
        args.extend_from_slice(keys);
        let out = self.run(&args);
        assert!(
            out.status.success(),
            "tmux send-keys {keys:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn text(&self, text: &str) {
        self.keys(&["-l", text]);
    }

    /// `Some(exit status)` once `top` has ended.
    fn exit_status(&self) -> Option<i32> {
        let text = std::fs::read_to_string(&self.exit_file).ok()?;
        text.trim().parse().ok()
    }

    /// Polls the screen until `pred` holds; panics with the last screen otherwise.
    fn wait_for(&self, what: &str, secs: u64, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let screen = self.screen();
            if pred(&screen) {
                return screen;
            }
            if Instant::now() > deadline {
                panic!("tokenwatch top: {what} did not happen within {secs} s; screen:\n{screen}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn wait_exit(&self, secs: u64) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(status) = self.exit_status() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "tokenwatch top did not exit; screen:\n{}",
                self.screen()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

fn top_command(url: &str, extra: &str) -> String {
    format!("top --url {url} --interval 500ms {extra}")
}

/// The number before `unit` in a table row (`41.0 ms`, `2.50 s`), the first such cell.
fn latency_ms(row: &str) -> Option<f64> {
    let t: Vec<&str> = row.split_whitespace().collect();
    t.windows(2).find_map(|w| match w[1] {
        "ms" => w[0].parse().ok(),
        "s" => w[0].parse::<f64>().ok().map(|s| s * 1000.0),
        _ => None,
    })
}

/// The first per-second rate cell of a row (`4.1/s`, `12.3k/s`): the REQ/S column.
fn first_rate(row: &str) -> Option<f64> {
    row.split_whitespace().find_map(|tok| {
        let n = tok.strip_suffix("/s")?;
        match n.strip_suffix('k') {
            Some(k) => k.parse::<f64>().ok().map(|v| v * 1000.0),
            None => n.parse().ok(),
        }
    })
}

fn row<'a>(screen: &'a str, model: &str) -> Option<&'a str> {
    screen.lines().find(|l| l.contains(model))
}

/// A model row with a TTFT in ms and a request rate above zero.
fn has_numbers(screen: &str, model: &str) -> bool {
    row(screen, model).is_some_and(|r| {
        latency_ms(r).is_some_and(|v| v > 0.0) && first_rate(r).is_some_and(|v| v > 0.0)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_shows_the_demo_fleet_sorts_filters_and_quits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (demo, api, _) = start_demo(dir.path(), &["--fault-after", "1h", "--rps", "10"]).await;
    // Wait until the API itself reports traffic for both models, so the screen has numbers to show.
    let url = format!("http://{api}/api/v1/fleet?window=1m");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let reply = send("GET", &url, None, &[]).await;
        let ready = reply
            .as_ref()
            .ok()
            .filter(|r| r.status == 200)
            .is_some_and(|r| {
                let models = r.json()["models"].as_array().cloned().unwrap_or_default();
                [LLAMA, QWEN].iter().all(|m| {
                    models.iter().any(|x| {
                        x["model_id"] == *m
                            && x["requests_per_s"].as_f64().unwrap_or(0.0) > 0.0
                            && x["ttft_p50_s"].is_number()
                    })
                })
            });
        if ready {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "GET {url} never showed traffic for both demo models; last answer: {}\ndemo log:\n{}",
            reply
                .map(|r| format!("{} {}", r.status, r.body))
                .unwrap_or_else(|e| e),
            demo.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let tmux = Tmux::start(dir.path(), &top_command(&format!("http://{api}"), ""));
    let screen = tmux.wait_for("both models with a TTFT in ms and req/s > 0", 30, |s| {
        has_numbers(s, LLAMA) && has_numbers(s, QWEN)
    });
    assert!(
        screen.contains(&format!("http://{api}")) && screen.contains("models 2/2"),
        "header:\n{screen}"
    );
    assert!(
        screen.contains("● connected") && screen.contains("MODEL▲"),
        "{screen}"
    );
    for model in [LLAMA, QWEN] {
        let r = row(&screen, model).unwrap_or_default();
        assert!(r.contains('%'), "KV/error columns of {model}: {r:?}");
    }

    tmux.text("s");
    tmux.wait_for("sorting by TTFT p50", 10, |s| {
        s.contains("sort TTFT p50▼") && s.contains("TTFT p50▼")
    });

    tmux.text("/qwen");
    tmux.wait_for("the filter input", 10, |s| {
        s.contains("filter model id: qwen")
    });
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for("the filter hiding llama", 10, |s| {
        row(s, QWEN).is_some() && !s.contains(LLAMA)
    });
    assert!(
        screen.contains("filter \"qwen\"") && screen.contains("models 1/2"),
        "{screen}"
    );

    tmux.keys(&["Enter"]);
    tmux.wait_for("the detail pane with the model's alerts", 10, |s| {
        s.contains(&format!("{QWEN} — Enter/Esc close"))
            && s.contains("alerts")
            && !s.contains("alerts: loading")
    });
    tmux.keys(&["Escape"]);
    tmux.wait_for("the detail pane closing", 10, |s| {
        !s.contains("Enter/Esc close")
    });

    tmux.text("q");
    assert_eq!(tmux.wait_exit(10), 0, "q ends tokenwatch top with status 0");
    let after = tmux.screen();
    assert!(
        !after.contains("TTFT p50") && !after.contains(QWEN),
        "the terminal is restored (alternate screen left):\n{after}"
    );
}

#[test]
fn top_without_a_server_reports_the_error_and_keeps_running() {
    let dir = tempfile::tempdir().expect("tempdir");
    // An address nobody listens on: top cannot reach it.
    let addr = free_addr();
    let tmux = Tmux::start(
        dir.path(),
        &top_command(&format!("http://{addr}"), "--timeout 1s"),
    );
    let screen = tmux.wait_for("the connection error in the header", 20, |s| {
        s.contains("✗ cannot reach") && s.contains("retrying")
    });
    assert!(screen.contains("waiting for data"), "{screen}");
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(
        tmux.exit_status(),
        None,
        "top keeps running and retrying:\n{}",
        tmux.screen()
    );
    tmux.keys(&["C-c"]);
    assert_eq!(
        tmux.wait_exit(10),
        0,
        "Ctrl-C ends tokenwatch top with status 0"
    );
}

#[test]
fn top_rejects_bad_arguments_before_touching_the_terminal() {
    for (args, expect) in [
        (vec!["top", "--interval", "100ms"], "at least 200ms"),
        (vec!["top", "--window", "2m"], "expected 1m, 5m or 1h"),
        (
            vec!["top", "--url", "ftp://127.0.0.1:9464"],
            "expected an address such as http://127.0.0.1:9464",
        ),
        (
            vec!["top", "--ca-file", "/etc/hostname"],
            "--ca-file is for an https:// address",
        ),
    ] {
        let out = Command::new(BIN)
            .args(&args)
            .output()
            .expect("run tokenwatch");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(expect),
            "{args:?}: {err}"
        );
    }
}
