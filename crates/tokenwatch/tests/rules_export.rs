// `tokenwatch rules export --format prometheus`: the real binary writes a rules file that the
// real `promtool check rules` accepts; bad formats and bad configurations fail clearly.

mod common;

use std::process::Command;

fn tokenwatch(args: &[&str]) -> std::process::Output {
    Command::new(common::BIN)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running tokenwatch {args:?}: {e}"))
}

#[test]
fn exported_rules_pass_promtool() {
    let promtool = common::promtool();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tokenwatch.yaml");
    std::fs::write(&cfg, "listen: 127.0.0.1:9464\n").unwrap();
    let file = dir.path().join("rules.yml");
    let out = tokenwatch(&[
        "rules",
        "export",
        "--format",
        "prometheus",
        "-c",
        cfg.to_str().unwrap(),
        "-o",
        file.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "export failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&file).unwrap();
    for name in [
        "ttft_p99_absolute",
        "ttft_p99_spike",
        "kv_cache_pressure",
        "gpu_memory_leak",
        "slo_error_budget_burn",
    ] {
        assert!(
            text.contains(&format!("alert: \"{name}\"")),
            "{name} missing from\n{text}"
        );
    }

    let check = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        check.status.success(),
        "promtool check rules failed:\n{report}\n--- file ---\n{text}"
    );
    assert!(report.contains("SUCCESS: 6 rules found"), "{report}");

    // Without -o the same rules go to standard output.
    let stdout = tokenwatch(&["rules", "export", "--format", "prometheus"]);
    assert!(stdout.status.success());
    assert_eq!(String::from_utf8_lossy(&stdout.stdout), text);
}

#[test]
fn unknown_format_and_bad_config_are_refused() {
    let out = tokenwatch(&["rules", "export", "--format", "thanos"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("thanos") && err.contains("prometheus"),
        "error should list the formats: {err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.yaml");
    std::fs::write(&cfg, "no_such_key: 1\n").unwrap();
    let out = tokenwatch(&[
        "rules",
        "export",
        "--format",
        "prometheus",
        "-c",
        cfg.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml"),
        "error should name the file: {err}"
    );
}
