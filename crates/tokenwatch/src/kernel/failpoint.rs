// Test-only failpoints: an analysis stage made to panic on purpose, so that the end-to-end tests
// can prove that a panicking analysis thread fails open (issue 28: the proxy forwards every
// byte as before, the records in hand are dropped and counted, `/readyz` names the failure).
//
// `TOKENWATCH_TEST_PANIC=<stage>:<model>[,<stage>:<model>…]` makes `<stage>` (`pipeline`: the
// pipeline thread, `alerting`: the alert engine) panic on each request record of `<model>` it
// handles. Read once, from the environment, and only in debug builds.
//
// Why an environment variable compiled into debug builds only, and not the `fail` crate behind a
// cargo feature: the end-to-end tests run the binary cargo builds for them
// (`CARGO_BIN_EXE_tokenwatch`, a debug build with the default features), so a feature would have
// to be on in every test build — that is, in every `cargo build` of the workspace, features
// being unified — while `debug_assertions` is off in every release build without anyone having
// to remember it: the release binary, the Docker image and the packages have no failpoint at
// all (the function below is empty there), and a debug build has one only when the variable
// names it. No dependency either.

/// The environment variable naming the failpoints (debug builds only).
pub const ENV: &str = "TOKENWATCH_TEST_PANIC";

/// Panic when the failpoint `stage:model` is set (debug builds only; a no-op in release builds).
#[cfg(debug_assertions)]
pub fn panic_on_model(stage: &str, model: &str) {
    use std::sync::OnceLock;
    static SPEC: OnceLock<Vec<(String, String)>> = OnceLock::new();
    let spec = SPEC.get_or_init(|| {
        let spec = parse(&std::env::var(ENV).unwrap_or_default());
        if !spec.is_empty() {
            tracing::warn!(failpoints = ?spec, "{ENV} is set (a debug build under test): these analysis stages panic on records of these models");
        }
        spec
    });
    if spec.iter().any(|(s, m)| s == stage && m == model) {
        panic!("failpoint {ENV}: the {stage} stage panics on a record of model {model:?}");
    }
}

/// A release build has no failpoint.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn panic_on_model(_stage: &str, _model: &str) {}

/// `stage:model` pairs, comma-separated; malformed entries are ignored.
#[cfg_attr(not(debug_assertions), allow(dead_code))]
fn parse(text: &str) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|e| e.trim().split_once(':'))
        .filter(|(s, m)| !s.is_empty() && !m.is_empty())
        .map(|(s, m)| (s.to_string(), m.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn pairs_are_read_and_malformed_entries_ignored() {
        assert_eq!(
            super::parse("pipeline:boom, alerting:bang,nonsense,:x,y:"),
            vec![
                ("pipeline".to_string(), "boom".to_string()),
                ("alerting".to_string(), "bang".to_string())
            ]
        );
        assert!(super::parse("").is_empty());
    }
}
