// Shared by tests/auth.rs: the tokens, the five callers (none, unknown, one per role), what each
// route needs and answers, a check of a refused reply, and `check-config` on a YAML text.
#![allow(dead_code)]

use crate::common::{BIN, Reply, send};
use std::path::Path;
use std::process::Command;

pub const READ: &str = "rd-7c1e9f04b2d84a6e93f1";
pub const INGEST: &str = "in-3b8d5a2f9e0c47d1b6a4";
pub const ADMIN: &str = "ad-e4f2a9c1d7b04e38a5c2";
pub const UNKNOWN: &str = "xx-0a9b8c7d6e5f4a3b2c1d";
pub const READ2: &str = "rd-51f0c3e8a7b94d26e0b7";

/// The five callers: no token, an unknown one, and one of each role.
pub const CALLERS: [(&str, Option<&str>); 5] = [
    ("none", None),
    ("unknown", Some(UNKNOWN)),
    ("read", Some(READ)),
    ("ingest", Some(INGEST)),
    ("admin", Some(ADMIN)),
];

/// Write `yaml` to a file in `dir` and run `check-config` on it: (success, stdout + stderr).
pub fn check_config(dir: &Path, yaml: &str) -> (bool, String) {
    let file = dir.join("tw.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(BIN)
        .args(["check-config", file.to_str().unwrap()])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Sends with `Authorization: Bearer token` when a token is given.
pub async fn call(method: &str, url: &str, body: Option<&str>, token: Option<&str>) -> Reply {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("authorization", a)])
        .unwrap_or_default();
    send(method, url, body, &headers)
        .await
        .unwrap_or_else(|e| panic!("{method} {e}"))
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    Open,
    Read,
    Ingest,
}

/// A request to make as every caller: method, URL, body, what it needs, which listener.
pub struct Route {
    pub method: &'static str,
    pub url: String,
    pub body: Option<String>,
    pub needs: Needs,
    pub listener: &'static str,
}

pub fn route(method: &'static str, url: String, needs: Needs, listener: &'static str) -> Route {
    Route {
        method,
        url,
        body: None,
        needs,
        listener,
    }
}

/// The status `caller` must get where `needs` applies.
pub fn expected(needs: Needs, caller: &str) -> u16 {
    match (needs, caller) {
        (Needs::Open, _) => 200,
        (_, "none" | "unknown") => 401,
        (_, "admin") => 200,
        (Needs::Read, "read") | (Needs::Ingest, "ingest") => 200,
        _ => 403,
    }
}

/// Check a 401 / 403 reply (JSON error naming the role, WWW-Authenticate on 401); returns the
/// `reason` label it is counted under.
pub fn check_refusal(r: &Reply, needs: Needs, caller: &str, what: &str) -> &'static str {
    let v = r.json();
    let (kind, reason) = match (r.status, caller) {
        (403, _) => ("forbidden", "forbidden"),
        (_, "none") => ("unauthorized", "missing"),
        _ => ("unauthorized", "unknown"),
    };
    assert_eq!(v["error"]["type"], kind, "{what}: {v}");
    let role = if needs == Needs::Read {
        "a `read`"
    } else {
        "an `ingest`"
    };
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    let want = format!("needs {role} token (Authorization: Bearer …); see auth.tokens_file");
    assert!(msg.contains(&want), "{what}: {msg}");
    let challenged = r
        .headers
        .get("www-authenticate")
        .is_some_and(|h| h == "Bearer");
    assert_eq!(challenged, r.status == 401, "{what}: WWW-Authenticate");
    reason
}
