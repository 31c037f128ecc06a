// Operator conveniences through the real binary: `TOKENWATCH_CONFIG` as the default
// configuration file, `${ENV_VAR}` expansion in it (and its file:line errors), durations in
// Prometheus syntax, and `--log-format json` log lines.

use crate::common;

use common::{BIN, free_addr};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A child process killed when dropped.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn output(cmd: &mut Command) -> (bool, String) {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

#[test]
fn tokenwatch_config_names_the_default_file_and_env_vars_expand() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tw.yaml");
    std::fs::write(
        &file,
        "# the API port comes from ${TW_TEST_PORT}\nlisten: 127.0.0.1:${TW_TEST_PORT}\nproxy:\n  upstreams:\n    - url: http://${TW_TEST_HOST}:8000\n      instance: \"${TW_TEST_HOST}\"\n  idle_timeout: 1m30s\nstore:\n  raw_retention: 1.5d\n",
    )
    .unwrap();
    let (ok, out) = output(
        Command::new(BIN)
            .arg("check-config")
            .env("TOKENWATCH_CONFIG", &file)
            .env("TW_TEST_PORT", "19464")
            .env("TW_TEST_HOST", "vllm.internal"),
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("tw.yaml: OK (1 upstream route(s), API on 127.0.0.1:19464"),
        "{out}"
    );

    // A variable that is not set: the error names it, the file and the line.
    let (ok, out) = output(
        Command::new(BIN)
            .arg("check-config")
            .env("TOKENWATCH_CONFIG", &file)
            .env("TW_TEST_PORT", "19464")
            .env_remove("TW_TEST_HOST"),
    );
    assert!(!ok, "{out}");
    let at = format!(
        "{}:5: environment variable TW_TEST_HOST is not set",
        file.display()
    );
    assert!(out.contains(&at), "{out}");

    // An explicit file wins over TOKENWATCH_CONFIG.
    let other = dir.path().join("other.yaml");
    std::fs::write(&other, "listen: 127.0.0.1:19999\n").unwrap();
    let (ok, out) = output(
        Command::new(BIN)
            .arg("check-config")
            .arg(&other)
            .env("TOKENWATCH_CONFIG", &file),
    );
    assert!(
        ok && out.contains("other.yaml: OK") && out.contains("127.0.0.1:19999"),
        "{out}"
    );

    // Without either, check-config says what it needs.
    let (ok, out) = output(
        Command::new(BIN)
            .arg("check-config")
            .env_remove("TOKENWATCH_CONFIG"),
    );
    assert!(!ok && out.contains("<FILE>"), "{out}");
}

#[test]
fn durations_in_prometheus_syntax_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tw.yaml");
    std::fs::write(&file, "proxy:\n  idle_timeout: 30m1h\n").unwrap();
    let (ok, out) = output(Command::new(BIN).arg("check-config").arg(&file));
    assert!(
        !ok && out.contains("key proxy.idle_timeout") && out.contains("largest to smallest"),
        "{out}"
    );
}

#[tokio::test]
async fn run_reads_tokenwatch_config_and_logs_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    // A fixed address, not port 0: the test checks that the file's `listen` is what it binds
    // and logs.
    let api = free_addr();
    let file = dir.path().join("tw.yaml");
    std::fs::write(
        &file,
        format!(
            "listen: {api}\ndata_dir: {}\notlp:\n  enabled: false\ngpu:\n  enabled: false\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let log = dir.path().join("tokenwatch.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(BIN)
        .args(["--log-format", "json", "run"])
        .env("TOKENWATCH_CONFIG", &file)
        .env("TOKENWATCH_LOG", "info")
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = common::send("GET", &format!("http://{api}/readyz"), None, &[]).await
            && r.status == 200
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never ready on {api}; log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its start line written (it may follow the first answer of /readyz).
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("\"tokenwatch running\"") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no start line in the log:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.0.kill();
    let _ = child.0.wait();

    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "no log lines");
    for l in &lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}"));
        assert!(
            v["timestamp"].is_string() && v["level"].is_string() && v["message"].is_string(),
            "{l}"
        );
    }
    assert!(
        lines.iter().any(|l| l.contains("\"tokenwatch running\"")
            && l.contains(&format!("\"api\":\"{api}\""))
            && l.contains(&format!("\"listening\":\"api={api}\""))),
        "no start-up line with its fields:\n{text}"
    );
}

/// `tokenwatch completions bash`, loaded into a real bash, completes subcommands and flags.
#[test]
fn bash_completion_completes_subcommands_and_flags() {
    let (ok, script) = output(Command::new(BIN).args(["completions", "bash"]));
    assert!(ok, "{script}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokenwatch.bash");
    std::fs::write(&file, &script).unwrap();
    // Drive the completion function as bash does on TAB: COMP_WORDS/COMP_CWORD in, COMPREPLY out.
    let complete = |words: &str| {
        let probe = format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMP_LINE=\"${{COMP_WORDS[*]}}\"; COMP_POINT=${{#COMP_LINE}}; _tokenwatch tokenwatch \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            file.display()
        );
        let (ok, out) = output(Command::new("bash").arg("-c").arg(probe));
        assert!(ok, "{words}: {out}");
        out
    };
    let out = complete("tokenwatch da");
    assert!(out.lines().any(|l| l == "dashboards"), "{out}");
    let out = complete("tokenwatch run --log-f");
    assert!(out.lines().any(|l| l == "--log-format"), "{out}");
    let out = complete("tokenwatch dashboards export --format ''");
    assert!(out.lines().any(|l| l == "grafana"), "{out}");

    for shell in ["zsh", "fish"] {
        let (ok, script) = output(Command::new(BIN).args(["completions", shell]));
        assert!(
            ok && script.contains("dashboards") && script.contains("check-config"),
            "{shell}: {script}"
        );
    }
    let (ok, out) = output(Command::new(BIN).args(["completions", "tcsh"]));
    assert!(!ok && out.contains("bash"), "{out}");
}

/// What `run` creates is its user's alone: the data directory 0700, the store, the salt and the
/// other files in it 0600 (umask 077), whatever the umask it was started with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_keeps_its_data_directory_private() {
    use std::os::unix::fs::PermissionsExt;
    let stack =
        common::Stack::start(&["--model", "m1", "--ttft-ms", "1", "--itl-ms", "1"], &[]).await;
    let r = common::send(
        "POST",
        &format!("http://{}/v1/chat/completions", stack.proxy),
        Some(r#"{"model":"m1","messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#),
        &[("x-request-id", "private-1")],
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    common::stored_record(stack.api, "private-1", &stack.tw).await;
    let data = stack.data_dir();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700, "{}", data.display());
    let mut files = 0;
    for e in std::fs::read_dir(&data).unwrap().flatten() {
        let p = e.path();
        let want = if p.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode(&p), want, "{}", p.display());
        files += 1;
    }
    assert!(files >= 2, "the store and the salt at least: {files}");
}
