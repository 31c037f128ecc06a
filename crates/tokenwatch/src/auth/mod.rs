// Authentication: the `auth:` configuration, bearer tokens with roles checked on the API and OTLP
// listeners (reloaded when the tokens file changes), failure counting, and the refusal to listen
// off loopback without tokens unless told so explicitly.

pub mod grpc;
pub mod http;
pub mod tokens;

use crate::kernel::duration::HumanDuration;
use crate::kernel::telemetry::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;
pub use tokens::{Role, TokenSet, TokensError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Shortest reload interval accepted (the file is re-read on every tick).
const MIN_RELOAD_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// `ROLE TOKEN [NAME]` per line (roles `read`, `admin`, `ingest`); unset: no tokens are checked.
    pub tokens_file: Option<PathBuf>,
    /// Listen off loopback without tokens anyway (logged as a warning at every start).
    pub allow_unauthenticated: bool,
    /// How often the tokens file is checked for changes.
    pub reload_interval: HumanDuration,
    /// Host names (no port) the API and OTLP/HTTP listeners answer besides loopback's
    /// (`localhost`, an IP address) when bound to loopback, e.g. behind a reverse proxy that
    /// keeps the client's `Host`; `*` for any. Other names get 403 (DNS rebinding). Once some
    /// are listed, listeners off loopback check names the same way.
    pub allowed_hosts: Vec<String>,
    /// Origins (`https://grafana.example.com`) whose pages may send writes (POST, PUT, DELETE,
    /// PATCH) to the API and OTLP/HTTP listeners besides tokenwatch's own page; a write from
    /// any other page (an `Origin` header naming another site) gets 403.
    pub allowed_origins: Vec<String>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            tokens_file: None,
            allow_unauthenticated: false,
            reload_interval: HumanDuration(Duration::from_secs(5)),
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
        }
    }
}

/// Checks of the `auth:` section for `Config::validate`: the tokens file, the interval (the
/// listeners' exposure, which reads other sections too, is `Config::exposure_problem`).
pub fn validate(auth: &AuthConfig) -> Result<(), (String, String)> {
    if auth.reload_interval.0 < MIN_RELOAD_INTERVAL {
        return Err((
            "auth.reload_interval".into(),
            format!("must be at least {}ms", MIN_RELOAD_INTERVAL.as_millis()),
        ));
    }
    crate::listen::browser::BrowserPolicy::from_lists(&auth.allowed_hosts, &auth.allowed_origins)?;
    if let Some(file) = &auth.tokens_file {
        TokenSet::load(file).map_err(|e| ("auth.tokens_file".to_string(), e.to_string()))?;
    }
    Ok(())
}

/// Which listener a failed attempt was made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    Api,
    Otlp,
}

impl Listener {
    fn label(self) -> &'static str {
        match self {
            Listener::Api => "api",
            Listener::Otlp => "otlp",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    reason: &'static str,
    listener: &'static str,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// No bearer token (401).
    Missing { needed: Role },
    /// A bearer token that is not configured (401).
    Unknown { needed: Role },
    /// A configured token whose role does not include `needed` (403).
    Forbidden { needed: Role, has: Role },
}

impl Denied {
    fn reason(&self) -> &'static str {
        match self {
            Denied::Missing { .. } => "missing",
            Denied::Unknown { .. } => "unknown",
            Denied::Forbidden { .. } => "forbidden",
        }
    }

    /// 401 (missing or unknown token) or 403 (wrong role).
    pub fn is_forbidden(&self) -> bool {
        matches!(self, Denied::Forbidden { .. })
    }

    /// The sentence for a client: what was wrong and which role `what` needs.
    pub fn message(&self, what: &str) -> String {
        let (lead, needed) = match self {
            Denied::Missing { needed } => (String::new(), needed),
            Denied::Unknown { needed } => ("the bearer token is not known: ".to_string(), needed),
            Denied::Forbidden { needed, has } => (
                format!("this token has the `{}` role: ", has.name()),
                needed,
            ),
        };
        let article = if *needed == Role::Read { "a" } else { "an" };
        format!(
            "{lead}{what} needs {article} `{}` token (Authorization: Bearer …); see auth.tokens_file",
            needed.name()
        )
    }
}

/// Who made a request, as the audit log names it: the token's name (or `ROLE#LINE`) with its
/// role; `anonymous` without a token (or without a tokens file), `unknown-token` for an unknown one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub name: Arc<str>,
    pub role: Option<Role>,
}

impl Caller {
    pub fn anonymous() -> Caller {
        Caller {
            name: "anonymous".into(),
            role: None,
        }
    }

    fn unknown_token() -> Caller {
        Caller {
            name: "unknown-token".into(),
            role: None,
        }
    }
}

/// The configured tokens and the failure counter; shared by every listener.
pub struct Auth {
    file: PathBuf,
    reload_interval: Duration,
    /// Digest of the file's bytes that were loaded at start (what the reloader compares with).
    loaded: Option<[u8; 32]>,
    tokens: RwLock<Arc<TokenSet>>,
    failures: Family<FailureLabels, Counter>,
}

/// A cheap handle on the auth state; without a tokens file every check passes.
#[derive(Clone, Default)]
pub struct AuthHandle(Option<Arc<Auth>>);

/// The token of an `Authorization: Bearer …` value, if it is one.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl AuthHandle {
    /// Load the tokens file and warn about an explicit opt-out (the caller refuses an
    /// accidental exposure first, `Config::exposure_problem`).
    pub fn from_config(auth: &AuthConfig) -> Result<AuthHandle, anyhow::Error> {
        if auth.allow_unauthenticated {
            tracing::warn!(
                "auth.allow_unauthenticated is true: listeners off loopback accept requests without a token"
            );
        }
        let Some(file) = &auth.tokens_file else {
            return Ok(AuthHandle(None));
        };
        let name = file.display().to_string();
        let bytes = std::fs::read(file).map_err(|source| {
            anyhow::anyhow!(
                "auth.tokens_file: {}",
                TokensError::Read {
                    file: name.clone(),
                    source
                }
            )
        })?;
        let set = TokenSet::from_bytes(&bytes, &name)
            .map_err(|e| anyhow::anyhow!("auth.tokens_file: {e}"))?;
        if let Some(mode) = readable_by_others(file) {
            tracing::warn!(
                file = %file.display(),
                mode = format!("{mode:o}"),
                "auth.tokens_file is readable by other users of this machine: chmod 600 it"
            );
        }
        tracing::info!(file = %file.display(), tokens = set.len(), "auth: tokens loaded; API and OTLP need bearer tokens");
        Ok(AuthHandle(Some(Arc::new(Auth {
            file: file.clone(),
            reload_interval: auth.reload_interval.0,
            loaded: Some(Sha256::digest(&bytes).into()),
            tokens: RwLock::new(Arc::new(set)),
            failures: Family::default(),
        }))))
    }

    pub fn enabled(&self) -> bool {
        self.0.is_some()
    }

    /// Expose `tokenwatch_auth_failures_total{reason, listener}`.
    pub fn register(&self, metrics: &Metrics) {
        if let Some(auth) = &self.0 {
            metrics.register(
                "tokenwatch_auth_failures",
                "Requests refused for a missing or unknown bearer token, or one of the wrong role",
                auth.failures.clone(),
            );
        }
    }

    /// Whether `authorization` (the header's value) allows `needed`; refusals are counted.
    pub fn check(
        &self,
        authorization: Option<&[u8]>,
        needed: Role,
        listener: Listener,
    ) -> Result<(), Denied> {
        self.authorize(authorization, needed, listener)
            .map(|_| ())
            .map_err(|(d, _)| d)
    }

    /// As `check`, naming the caller either way (for the audit log).
    pub fn authorize(
        &self,
        authorization: Option<&[u8]>,
        needed: Role,
        listener: Listener,
    ) -> Result<Caller, (Denied, Caller)> {
        let Some(auth) = &self.0 else {
            return Ok(Caller::anonymous());
        };
        let result = match authorization {
            None => Err((Denied::Missing { needed }, Caller::anonymous())),
            Some(raw) => match std::str::from_utf8(raw).ok().and_then(bearer) {
                None => Err((Denied::Missing { needed }, Caller::anonymous())),
                Some(token) => {
                    let set = auth
                        .tokens
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone();
                    match set.identify(token) {
                        None => Err((Denied::Unknown { needed }, Caller::unknown_token())),
                        Some((has, name)) => {
                            let caller = Caller {
                                name,
                                role: Some(has),
                            };
                            if has.grants(needed) {
                                Ok(caller)
                            } else {
                                Err((Denied::Forbidden { needed, has }, caller))
                            }
                        }
                    }
                }
            },
        };
        if let Err((d, _)) = &result {
            auth.failures
                .get_or_create(&FailureLabels {
                    reason: d.reason(),
                    listener: listener.label(),
                })
                .inc();
        }
        result
    }

    /// Re-read the tokens file every `auth.reload_interval` until `stop`; a change that parses
    /// replaces the tokens, one that does not is logged and the previous tokens stay. Both are
    /// configuration changes, told to `report` (the audit log records them).
    pub fn spawn_reload(
        &self,
        mut stop: watch::Receiver<bool>,
        report: impl Fn(TokensReload) + Send + 'static,
    ) -> Option<JoinHandle<()>> {
        let auth = self.0.clone()?;
        Some(tokio::spawn(async move {
            let mut seen: Option<[u8; 32]> = auth.loaded;
            let mut last_error: Option<String> = None;
            let mut tick = tokio::time::interval(auth.reload_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    r = stop.wait_for(|s| *s) => {
                        let _ = r;
                        return;
                    }
                }
                match tokio::fs::read(&auth.file).await {
                    Ok(bytes) => {
                        let d: [u8; 32] = Sha256::digest(&bytes).into();
                        if seen == Some(d) {
                            continue;
                        }
                        seen = Some(d);
                        auth.reload(&bytes, &mut last_error, &report);
                    }
                    Err(e) => {
                        let e = TokensError::Read {
                            file: auth.file.display().to_string(),
                            source: e,
                        }
                        .to_string();
                        if last_error.as_deref() != Some(e.as_str()) {
                            tracing::error!(error = %e, "auth: reloading the tokens file failed; the previous tokens stay in force");
                            report(TokensReload::Failed {
                                file: auth.file.display().to_string(),
                                error: e.clone(),
                            });
                            last_error = Some(e);
                        }
                        // Read again (and reparse) once the file is back.
                        seen = None;
                    }
                }
            }
        }))
    }
}

/// What one reload of the tokens file did.
#[derive(Debug, Clone, PartialEq)]
pub enum TokensReload {
    /// The changed file parsed; its `tokens` are in force.
    Reloaded { file: String, tokens: usize },
    /// The file changed but could not be read or parsed; the previous tokens stay.
    Failed { file: String, error: String },
}

impl Auth {
    fn reload(
        &self,
        bytes: &[u8],
        last_error: &mut Option<String>,
        report: &impl Fn(TokensReload),
    ) {
        let file = self.file.display().to_string();
        match TokenSet::from_bytes(bytes, &file) {
            Ok(set) => {
                tracing::info!(file = %file, tokens = set.len(), "auth: tokens file reloaded");
                report(TokensReload::Reloaded {
                    file,
                    tokens: set.len(),
                });
                *self.tokens.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(set);
                *last_error = None;
            }
            Err(e) => {
                tracing::error!(error = %e, "auth: the changed tokens file is invalid; the previous tokens stay in force");
                // TokensError never contains a token (see tokens.rs), so it may be logged.
                report(TokensReload::Failed {
                    file,
                    error: e.to_string(),
                });
                *last_error = Some(e.to_string());
            }
        }
    }
}

/// For tests: a handle over a fixed token set.
#[cfg(test)]
pub(crate) fn handle_for(set: TokenSet, file: &std::path::Path) -> AuthHandle {
    AuthHandle(Some(Arc::new(Auth {
        file: file.to_path_buf(),
        reload_interval: Duration::from_secs(5),
        loaded: None,
        tokens: RwLock::new(Arc::new(set)),
        failures: Family::default(),
    })))
}

/// The file's permission bits when its group or others may read it (Unix); None otherwise.
fn readable_by_others(file: &std::path::Path) -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(file).ok()?.permissions().mode() & 0o777;
        (mode & 0o044 != 0).then_some(mode)
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        None
    }
}

#[cfg(test)]
mod tests;
