// Tests of the auth state: role checks and failure counting, messages, the exposure refusal,
// the config checks, and reloading the tokens file.

use super::*;
use crate::config::Config;

const READ: &str = "read-token-0123456789abcdef";
const INGEST: &str = "ingest-token-0123456789abcdef";
const ADMIN: &str = "admin-token-0123456789abcdef";

fn handle() -> AuthHandle {
    let text = format!("read {READ}\ningest {INGEST}\nadmin {ADMIN}\n");
    handle_for(
        TokenSet::parse(&text, "t").unwrap(),
        std::path::Path::new("t"),
    )
}

fn check(h: &AuthHandle, value: Option<&str>, needed: Role) -> Result<(), Denied> {
    h.check(value.map(str::as_bytes), needed, Listener::Api)
}

#[test]
fn checks_follow_roles_and_count_failures() {
    let h = handle();
    let b = |t: &str| format!("Bearer {t}");
    assert_eq!(
        check(&h, None, Role::Read),
        Err(Denied::Missing { needed: Role::Read })
    );
    assert_eq!(
        check(&h, Some("Basic abc"), Role::Read),
        Err(Denied::Missing { needed: Role::Read })
    );
    assert_eq!(
        check(&h, Some("Bearer "), Role::Read),
        Err(Denied::Missing { needed: Role::Read })
    );
    assert_eq!(
        check(&h, Some(&b("nope-0123456789abcdef")), Role::Read),
        Err(Denied::Unknown { needed: Role::Read })
    );
    assert_eq!(check(&h, Some(&b(READ)), Role::Read), Ok(()));
    assert_eq!(
        check(&h, Some(&format!("bearer  {READ} ")), Role::Read),
        Ok(())
    );
    assert_eq!(
        check(&h, Some(&b(READ)), Role::Ingest),
        Err(Denied::Forbidden {
            needed: Role::Ingest,
            has: Role::Read
        })
    );
    assert_eq!(
        check(&h, Some(&b(INGEST)), Role::Read),
        Err(Denied::Forbidden {
            needed: Role::Read,
            has: Role::Ingest
        })
    );
    assert_eq!(check(&h, Some(&b(INGEST)), Role::Ingest), Ok(()));
    for needed in [Role::Read, Role::Ingest, Role::Admin] {
        assert_eq!(check(&h, Some(&b(ADMIN)), needed), Ok(()));
    }
    let metrics = Metrics::new();
    h.register(&metrics);
    let text = metrics.encode();
    for (reason, n) in [("missing", 3), ("unknown", 1), ("forbidden", 2)] {
        let series =
            format!("tokenwatch_auth_failures_total{{reason=\"{reason}\",listener=\"api\"}} {n}");
        assert!(text.contains(&series), "{series} not in:\n{text}");
    }
    // Without tokens everything passes.
    assert_eq!(
        AuthHandle::default().check(None, Role::Admin, Listener::Otlp),
        Ok(())
    );
}

#[test]
fn authorize_names_the_caller_either_way() {
    let h = handle();
    let who = |value: Option<String>, needed| {
        let r = h.authorize(value.as_deref().map(str::as_bytes), needed, Listener::Api);
        let (ok, c) = match r {
            Ok(c) => (true, c),
            Err((_, c)) => (false, c),
        };
        (ok, c.name.to_string(), c.role)
    };
    let b = |t: &str| Some(format!("Bearer {t}"));
    assert_eq!(
        who(b(READ), Role::Read),
        (true, "read#1".into(), Some(Role::Read))
    );
    assert_eq!(
        who(b(ADMIN), Role::Ingest),
        (true, "admin#3".into(), Some(Role::Admin))
    );
    assert_eq!(
        who(b(READ), Role::Ingest),
        (false, "read#1".into(), Some(Role::Read))
    );
    assert_eq!(who(None, Role::Read), (false, "anonymous".into(), None));
    assert_eq!(
        who(b("nope-0123456789abcdef"), Role::Read),
        (false, "unknown-token".into(), None)
    );
    assert_eq!(
        AuthHandle::default().authorize(None, Role::Admin, Listener::Api),
        Ok(Caller::anonymous())
    );
}

#[test]
fn messages_say_what_is_needed() {
    let m = Denied::Forbidden {
        needed: Role::Read,
        has: Role::Ingest,
    }
    .message("GET /api/v1/fleet");
    assert_eq!(
        m,
        "this token has the `ingest` role: GET /api/v1/fleet needs a `read` token (Authorization: Bearer …); see auth.tokens_file"
    );
    assert_eq!(
        Denied::Missing {
            needed: Role::Ingest
        }
        .message("OTLP export"),
        "OTLP export needs an `ingest` token (Authorization: Bearer …); see auth.tokens_file"
    );
}

#[test]
fn exposure_needs_tokens_or_an_explicit_opt_out() {
    let mut cfg = Config::default();
    assert_eq!(cfg.exposure_problem(), None);
    cfg.listen = "0.0.0.0:9464".parse().unwrap();
    let (key, msg) = cfg.exposure_problem().unwrap();
    assert_eq!(key, "listen");
    assert!(
        msg.contains("0.0.0.0:9464 is not a loopback address")
            && msg.contains("auth.allow_unauthenticated: true"),
        "{msg}"
    );
    cfg.listen = "[::1]:9464".parse().unwrap();
    cfg.otlp.http_listen = "[::]:4318".parse().unwrap();
    assert_eq!(cfg.exposure_problem().unwrap().0, "otlp.http_listen");
    cfg.otlp.enabled = false;
    assert_eq!(cfg.exposure_problem(), None);
    cfg.otlp.enabled = true;
    cfg.auth.tokens_file = Some("t".into());
    assert_eq!(cfg.exposure_problem(), None);

    // The proxy: only with an upstream, and tokens are not what makes it safe.
    cfg.proxy.listen = "0.0.0.0:8080".parse().unwrap();
    assert_eq!(cfg.exposure_problem(), None);
    cfg.proxy.upstreams = Config::from_yaml(
        "proxy:\n  upstreams:\n    - url: http://127.0.0.1:8000\n",
        "c",
    )
    .unwrap()
    .proxy
    .upstreams;
    let (key, msg) = cfg.exposure_problem().unwrap();
    assert_eq!(key, "proxy.listen");
    assert!(msg.contains("proxy.allow_public: true"), "{msg}");
    cfg.proxy.allow_public = true;
    assert_eq!(cfg.exposure_problem(), None);
    cfg.proxy.allow_public = false;
    cfg.auth.tokens_file = None;
    cfg.auth.allow_unauthenticated = true;
    cfg.listen = "0.0.0.0:1".parse().unwrap();
    assert_eq!(cfg.exposure_problem(), None);
}

#[test]
fn config_check_names_the_key_and_the_tokens_line() {
    let err = Config::from_yaml("listen: 0.0.0.0:9464\n", "c.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(
            "c.yaml: listen: 0.0.0.0:9464 is not a loopback address and no auth.tokens_file is set"
        ),
        "{err}"
    );
    let err = Config::from_yaml(
        "proxy:\n  listen: 0.0.0.0:8080\n  upstreams: [{url: 'http://127.0.0.1:1'}]\n",
        "c.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("c.yaml: proxy.listen: ") && err.contains("proxy.allow_public"),
        "{err}"
    );
    assert!(
        Config::from_yaml(
            "listen: 0.0.0.0:9464\nauth:\n  allow_unauthenticated: true\n",
            "c.yaml"
        )
        .is_ok()
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    std::fs::write(&file, format!("read {READ}\nadmin {ADMIN} oops again\n")).unwrap();
    let y = format!(
        "listen: 0.0.0.0:9464\nauth:\n  tokens_file: {}\n",
        file.display()
    );
    let err = Config::from_yaml(&y, "c.yaml").unwrap_err().to_string();
    assert!(
        err.contains("auth.tokens_file") && err.contains(&format!("{}:2: ", file.display())),
        "{err}"
    );
    assert!(!err.contains(ADMIN) && !err.contains(READ), "{err}");
    std::fs::write(&file, format!("read {READ}\n")).unwrap();
    assert!(Config::from_yaml(&y, "c.yaml").is_ok());
    let err = Config::from_yaml("auth:\n  reload_interval: 10ms\n", "c.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("auth.reload_interval"), "{err}");
    let err = Config::from_yaml("auth:\n  token_file: x\n", "c.yaml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("token_file"), "{err}");
}

#[tokio::test]
async fn reload_replaces_tokens_and_keeps_them_on_a_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    std::fs::write(&file, format!("read {READ}\n")).unwrap();
    let mut cfg = Config::default();
    cfg.auth.tokens_file = Some(file.clone());
    cfg.auth.reload_interval = HumanDuration(Duration::from_millis(100));
    let h = AuthHandle::from_config(&cfg.auth).unwrap();
    let (stop_tx, stop) = watch::channel(false);
    let reports = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let told = reports.clone();
    let task = h
        .spawn_reload(stop, move |r| told.lock().unwrap().push(r))
        .unwrap();
    let bearer = |t: &str| format!("Bearer {t}");
    let ok = |t: &str| check(&h, Some(&bearer(t)), Role::Read).is_ok();
    assert!(ok(READ));
    let wait = |want: bool, t: &'static str| {
        let h = h.clone();
        async move {
            for _ in 0..100 {
                if h.check(
                    Some(format!("Bearer {t}").as_bytes()),
                    Role::Read,
                    Listener::Api,
                )
                .is_ok()
                    == want
                {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            false
        }
    };
    std::fs::write(&file, format!("admin {ADMIN}\n")).unwrap();
    assert!(wait(true, ADMIN).await, "new token never accepted");
    assert!(!ok(READ));
    std::fs::write(&file, "admin short\n").unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(ok(ADMIN), "a bad file must keep the previous tokens");
    std::fs::remove_file(&file).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(ok(ADMIN));
    std::fs::write(&file, format!("read {READ}\n")).unwrap();
    assert!(wait(true, READ).await);
    stop_tx.send(true).unwrap();
    task.await.unwrap();
    // Each change is told once: loaded, refused (bad token), unreadable (gone), loaded again.
    let reports = reports.lock().unwrap().clone();
    let kinds: Vec<(&str, Option<usize>)> = reports
        .iter()
        .map(|r| match r {
            super::TokensReload::Reloaded { tokens, .. } => ("reloaded", Some(*tokens)),
            super::TokensReload::Failed { .. } => ("failed", None),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("reloaded", Some(1)),
            ("failed", None),
            ("failed", None),
            ("reloaded", Some(1))
        ],
        "{reports:#?}"
    );
}

#[cfg(unix)]
#[test]
fn a_tokens_file_others_can_read_is_told_apart() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    std::fs::write(&file, "admin t0k3n-long-enough-1234\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(super::readable_by_others(&file), Some(0o644));
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(super::readable_by_others(&file), None);
}
