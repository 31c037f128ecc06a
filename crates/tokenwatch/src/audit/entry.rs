// The audit log's lines: a request entry or a configuration event as one JSON object, and the
// redaction of credentials from query strings (no line ever holds a token).

use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::Arc;

/// Query parameters whose value is replaced by `REDACTED` (compared case-insensitively, decoded).
const SECRET_PARAMS: &[&str] = &[
    "token",
    "access_token",
    "api_key",
    "apikey",
    "key",
    "password",
    "secret",
    "auth",
    "authorization",
];

/// Longest path or query kept in a line; longer ones are cut (marked with `…`).
const MAX_FIELD_CHARS: usize = 2048;

/// One API request (or refused attempt) as the audit log records it.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestEntry {
    pub ts: DateTime<Utc>,
    pub caller: Arc<str>,
    pub role: Option<&'static str>,
    pub remote: Option<SocketAddr>,
    pub method: String,
    pub path: String,
    /// Already redacted (see `redact_query`).
    pub query: Option<String>,
    pub status: u16,
    pub bytes: u64,
    pub duration_ms: f64,
}

/// A configuration change or admin action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditEvent {
    /// The tokens file changed and was loaded: how many tokens it now holds.
    TokensReloaded { file: String, tokens: usize },
    /// The tokens file changed but could not be read or parsed; the previous tokens stay.
    TokensReloadFailed { file: String, error: String },
    /// The configuration file was reloaded (`trigger`: `sighup` or `api`): the sections applied
    /// and the changed keys that wait for a restart.
    ConfigReloaded {
        file: String,
        trigger: &'static str,
        applied: Vec<String>,
        restart_required: Vec<String>,
    },
    /// A configuration reload was refused (nothing applied).
    ConfigReloadFailed {
        file: String,
        trigger: &'static str,
        error: String,
    },
}

impl From<crate::auth::TokensReload> for AuditEvent {
    fn from(r: crate::auth::TokensReload) -> AuditEvent {
        match r {
            crate::auth::TokensReload::Reloaded { file, tokens } => {
                AuditEvent::TokensReloaded { file, tokens }
            }
            crate::auth::TokensReload::Failed { file, error } => {
                AuditEvent::TokensReloadFailed { file, error }
            }
        }
    }
}

/// Refused attempts of one client address, caller and status not written whole within one
/// window (`super::refusals`): how many, the first and the last.
#[derive(Debug, Clone, PartialEq)]
pub struct RefusedSummary {
    pub ts: DateTime<Utc>,
    /// None: the addresses beyond the window's cap, together.
    pub remote: Option<std::net::IpAddr>,
    pub caller: Arc<str>,
    pub status: u16,
    /// The method and path (None with the addresses beyond the cap).
    pub request: Option<(String, String)>,
    pub count: u64,
    pub first: DateTime<Utc>,
    pub last: DateTime<Utc>,
}

/// What travels from the request path to the writer thread (and what the writer writes).
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    Request(RequestEntry),
    Event {
        ts: DateTime<Utc>,
        event: AuditEvent,
    },
    /// Written by the writer thread only, at the end of a window of refusals.
    Refused(RefusedSummary),
}

#[derive(Serialize)]
struct RefusedLine<'a> {
    ts: String,
    event: &'static str,
    remote: String,
    caller: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<&'a str>,
    status: u16,
    count: u64,
    first: String,
    last: String,
}

#[derive(Serialize)]
struct RequestLine<'a> {
    ts: String,
    caller: &'a str,
    role: Option<&'a str>,
    remote: Option<String>,
    method: &'a str,
    path: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    query: Option<&'a str>,
    status: u16,
    bytes: u64,
    duration_ms: f64,
}

#[derive(Serialize)]
struct EventLine<'a> {
    ts: String,
    event: &'static str,
    file: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trigger: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    applied: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    restart_required: Option<&'a [String]>,
}

fn rfc3339_ms(ts: &DateTime<Utc>) -> String {
    ts.to_rfc3339_opts(SecondsFormat::Millis, true)
}

impl Record {
    /// The UTC day whose file the record goes to.
    pub fn day(&self) -> NaiveDate {
        match self {
            Record::Request(r) => r.ts.date_naive(),
            Record::Event { ts, .. } => ts.date_naive(),
            Record::Refused(r) => r.ts.date_naive(),
        }
    }

    /// The record as one JSON line, without the newline.
    pub fn to_line(&self) -> String {
        let line = match self {
            Record::Request(r) => serde_json::to_string(&RequestLine {
                ts: rfc3339_ms(&r.ts),
                caller: &r.caller,
                role: r.role,
                remote: r.remote.map(|a| a.to_string()),
                method: &r.method,
                path: &r.path,
                query: r.query.as_deref(),
                status: r.status,
                bytes: r.bytes,
                // Microsecond precision is plenty, and keeps the lines short.
                duration_ms: (r.duration_ms * 1000.0).round() / 1000.0,
            }),
            Record::Refused(r) => serde_json::to_string(&RefusedLine {
                ts: rfc3339_ms(&r.ts),
                event: "requests_refused",
                remote: r
                    .remote
                    .map_or_else(|| "other".to_string(), |ip| ip.to_string()),
                caller: &r.caller,
                method: r.request.as_ref().map(|(m, _)| m.as_str()),
                path: r.request.as_ref().map(|(_, p)| p.as_str()),
                status: r.status,
                count: r.count,
                first: rfc3339_ms(&r.first),
                last: rfc3339_ms(&r.last),
            }),
            Record::Event { ts, event } => {
                let mut line = EventLine {
                    ts: rfc3339_ms(ts),
                    event: "",
                    file: "",
                    tokens: None,
                    error: None,
                    trigger: None,
                    applied: None,
                    restart_required: None,
                };
                match event {
                    AuditEvent::TokensReloaded { file, tokens } => {
                        (line.event, line.file, line.tokens) =
                            ("auth_tokens_reloaded", file, Some(*tokens));
                    }
                    AuditEvent::TokensReloadFailed { file, error } => {
                        (line.event, line.file, line.error) =
                            ("auth_tokens_reload_failed", file, Some(error.as_str()));
                    }
                    AuditEvent::ConfigReloaded {
                        file,
                        trigger,
                        applied,
                        restart_required,
                    } => {
                        (line.event, line.file, line.trigger) =
                            ("config_reloaded", file, Some(*trigger));
                        (line.applied, line.restart_required) =
                            (Some(applied.as_slice()), Some(restart_required.as_slice()));
                    }
                    AuditEvent::ConfigReloadFailed {
                        file,
                        trigger,
                        error,
                    } => {
                        (line.event, line.file, line.trigger) =
                            ("config_reload_failed", file, Some(*trigger));
                        line.error = Some(error.as_str());
                    }
                }
                serde_json::to_string(&line)
            }
        };
        // Serializing plain strings and numbers cannot fail; a NaN duration becomes `null`.
        line.unwrap_or_else(|e| format!("{{\"error\":\"unserializable audit record: {e}\"}}"))
    }
}

/// Cut `s` to `MAX_FIELD_CHARS` characters.
pub fn bounded(s: &str) -> String {
    match s.char_indices().nth(MAX_FIELD_CHARS) {
        None => s.to_string(),
        Some((i, _)) => format!("{}…", &s[..i]),
    }
}

/// The query string with the value of every credential-like parameter (`token`, `access_token`,
/// `api_key`, …) replaced by `REDACTED`; the other parameters are kept as sent.
pub fn redact_query(query: &str) -> String {
    let parts: Vec<String> = query
        .split('&')
        .map(|pair| {
            let key = pair.split_once('=').map_or(pair, |(k, _)| k);
            let decoded: String = form_urlencoded::parse(key.as_bytes())
                .next()
                .map(|(k, _)| k.into_owned())
                .unwrap_or_default();
            if SECRET_PARAMS
                .iter()
                .any(|s| decoded.trim().eq_ignore_ascii_case(s))
            {
                format!("{key}=REDACTED")
            } else {
                pair.to_string()
            }
        })
        .collect();
    bounded(&parts.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn ts() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, 4, 5, 6, 7).unwrap() + chrono::Duration::milliseconds(89)
    }

    #[test]
    fn request_line_has_the_documented_fields_in_order() {
        let r = Record::Request(RequestEntry {
            ts: ts(),
            caller: "grafana".into(),
            role: Some("read"),
            remote: Some("127.0.0.1:5555".parse().unwrap()),
            method: "GET".into(),
            path: "/api/v1/requests".into(),
            query: Some("model=m".into()),
            status: 200,
            bytes: 1234,
            duration_ms: 2.71849,
        });
        assert_eq!(
            r.to_line(),
            r#"{"ts":"2026-03-04T05:06:07.089Z","caller":"grafana","role":"read","remote":"127.0.0.1:5555","method":"GET","path":"/api/v1/requests","query":"model=m","status":200,"bytes":1234,"duration_ms":2.718}"#
        );
        assert_eq!(r.day(), NaiveDate::from_ymd_opt(2026, 3, 4).unwrap());
        let anon = Record::Request(RequestEntry {
            ts: ts(),
            caller: "anonymous".into(),
            role: None,
            remote: None,
            method: "POST".into(),
            path: "/x\"y".into(),
            query: None,
            status: 401,
            bytes: 0,
            duration_ms: 0.0,
        });
        let v: serde_json::Value = serde_json::from_str(&anon.to_line()).unwrap();
        assert_eq!(v["role"], serde_json::Value::Null);
        assert_eq!(v["remote"], serde_json::Value::Null);
        assert_eq!(v["path"], "/x\"y");
        assert!(v.get("query").is_none(), "{v}");
    }

    #[test]
    fn event_lines() {
        let ok = Record::Event {
            ts: ts(),
            event: AuditEvent::TokensReloaded {
                file: "/etc/tw/tokens".into(),
                tokens: 3,
            },
        };
        assert_eq!(
            ok.to_line(),
            r#"{"ts":"2026-03-04T05:06:07.089Z","event":"auth_tokens_reloaded","file":"/etc/tw/tokens","tokens":3}"#
        );
        let bad = Record::Event {
            ts: ts(),
            event: AuditEvent::TokensReloadFailed {
                file: "t".into(),
                error: "t:2: bad".into(),
            },
        };
        assert_eq!(
            bad.to_line(),
            r#"{"ts":"2026-03-04T05:06:07.089Z","event":"auth_tokens_reload_failed","file":"t","error":"t:2: bad"}"#
        );
        let reloaded = Record::Event {
            ts: ts(),
            event: AuditEvent::ConfigReloaded {
                file: "tw.yaml".into(),
                trigger: "sighup",
                applied: vec!["proxy.upstreams".into()],
                restart_required: vec!["listen".into()],
            },
        };
        assert_eq!(
            reloaded.to_line(),
            r#"{"ts":"2026-03-04T05:06:07.089Z","event":"config_reloaded","file":"tw.yaml","trigger":"sighup","applied":["proxy.upstreams"],"restart_required":["listen"]}"#
        );
        let refused = Record::Event {
            ts: ts(),
            event: AuditEvent::ConfigReloadFailed {
                file: "tw.yaml".into(),
                trigger: "api",
                error: "bad".into(),
            },
        };
        assert_eq!(
            refused.to_line(),
            r#"{"ts":"2026-03-04T05:06:07.089Z","event":"config_reload_failed","file":"tw.yaml","error":"bad","trigger":"api"}"#
        );
    }

    #[test]
    fn credentials_in_the_query_are_redacted() {
        let cases = [
            ("model=m&token=abc", "model=m&token=REDACTED"),
            (
                "access_token=s3cret&limit=5",
                "access_token=REDACTED&limit=5",
            ),
            ("API_KEY=s3cret", "API_KEY=REDACTED"),
            ("api%5Fkey=s3cret", "api%5Fkey=REDACTED"),
            ("token", "token=REDACTED"),
            ("token=", "token=REDACTED"),
            ("tokens=5&max_tokens=9", "tokens=5&max_tokens=9"),
            ("a=1&&b=2", "a=1&&b=2"),
            ("", ""),
        ];
        for (q, want) in cases {
            assert_eq!(redact_query(q), want, "{q}");
        }
        let long = "a".repeat(MAX_FIELD_CHARS + 10);
        let cut = redact_query(&long);
        assert_eq!(cut.chars().count(), MAX_FIELD_CHARS + 1);
        assert!(cut.ends_with('…'));
    }
}
