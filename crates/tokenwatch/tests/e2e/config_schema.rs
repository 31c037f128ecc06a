// The published JSON Schema of tokenwatch.yaml: `tokenwatch schema` prints exactly the committed
// schemas/tokenwatch.schema.json, and the reference validator (Python `jsonschema`) agrees with
// the loader on real configurations (README, Kubernetes ConfigMap) and on broken ones.

use crate::common;

use common::{BIN, python};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Schema errors per file, from the reference validator.
fn validate(schema: &Path, files: &[PathBuf]) -> serde_json::Map<String, Value> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/validate_config_schema.py");
    let out = Command::new(python())
        .arg(script)
        .arg(schema)
        .args(files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "validator failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    match serde_json::from_slice(&out.stdout).unwrap() {
        Value::Object(m) => m,
        other => panic!("unexpected validator output {other}"),
    }
}

fn check_config(file: &Path) -> (bool, String) {
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(file)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_published_schema_is_what_the_binary_prints() {
    let out = Command::new(BIN).arg("schema").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let published = std::fs::read_to_string(repo().join("schemas/tokenwatch.schema.json")).unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout) == published,
        "schemas/tokenwatch.schema.json is stale: run `tokenwatch schema -o schemas/tokenwatch.schema.json`"
    );
}

#[test]
fn the_validator_accepts_real_configurations_and_refuses_what_the_loader_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let schema = repo().join("schemas/tokenwatch.schema.json");
    let mut good = Vec::new();
    // Every configuration example of the README.
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    for (i, block) in readme.split("```yaml\n").skip(1).enumerate() {
        let body = block.split("```").next().unwrap();
        let path = dir.path().join(format!("readme-{i}.yaml"));
        std::fs::write(&path, body).unwrap();
        good.push(path);
    }
    assert!(good.len() >= 3, "README configuration examples not found");
    // The Kubernetes ConfigMap's tokenwatch.yaml (tests/deploy_artifacts.rs runs check-config on it
    // with its tokens file in place).
    let cm = std::fs::read_to_string(repo().join("deploy/kubernetes/configmap.yaml")).unwrap();
    let embedded: String = cm
        .split("tokenwatch.yaml: |\n")
        .nth(1)
        .unwrap()
        .lines()
        .take_while(|l| l.starts_with("    ") || l.trim().is_empty())
        .map(|l| format!("{}\n", l.get(4..).unwrap_or("")))
        .collect();
    let cm_path = dir.path().join("configmap.yaml");
    std::fs::write(&cm_path, &embedded).unwrap();
    good.push(cm_path);

    // Broken files: each refused by the loader, with the key named, and by the schema.
    let bad = [
        (
            "unknown-top",
            "listen: 127.0.0.1:9464\nlisten_port: 9\n",
            "listen_port",
        ),
        (
            "unknown-nested",
            "store:\n  backend: sqlite\n  retension: 7d\n",
            "retension",
        ),
        (
            "bad-duration",
            "telemetry:\n  flush_interval: fast\n",
            "flush_interval",
        ),
        ("wrong-type", "telemetry:\n  batch_max: many\n", "batch_max"),
        ("bad-enum", "store:\n  backend: postgres\n", "backend"),
    ];
    let mut bad_paths = Vec::new();
    for (name, text, key) in bad {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, text).unwrap();
        let (ok, err) = check_config(&path);
        assert!(
            !ok && err.contains(key),
            "{name}: check-config should refuse naming {key}: {err}"
        );
        bad_paths.push(path);
    }

    let all: Vec<PathBuf> = good.iter().chain(&bad_paths).cloned().collect();
    let result = validate(&schema, &all);
    for path in &good {
        let errors = &result[&path.display().to_string()];
        assert_eq!(
            errors,
            &Value::Array(Vec::new()),
            "{} should validate",
            path.display()
        );
    }
    for path in &bad_paths {
        let errors = result[&path.display().to_string()].as_array().unwrap();
        assert!(!errors.is_empty(), "{} should not validate", path.display());
    }
}
