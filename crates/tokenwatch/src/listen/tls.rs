// Server certificates of tokenwatch's own listeners: the `tls` keys, which certificate each
// listener uses, PEM loading with errors naming key and file, and reloading when files change.

use crate::kernel::duration::HumanDuration;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// `tls`: the API listener's certificate, and the default of the proxy and OTLP listeners.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first.
    pub cert_file: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC).
    pub key_file: Option<PathBuf>,
    /// How often the certificate and key files are checked for changes.
    pub reload_interval: HumanDuration,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert_file: None,
            key_file: None,
            reload_interval: HumanDuration(Duration::from_secs(10)),
        }
    }
}

/// `proxy.tls` / `otlp.tls`: this listener's own certificate, or `enabled: false` to keep it
/// plain while the shared `tls` is set.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerTlsConfig {
    #[serde(default = "enabled_by_default")]
    pub enabled: bool,
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

fn enabled_by_default() -> bool {
    true
}

/// A TLS setup error: the configuration key it is about and what is wrong (naming the file).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{key}: {message}")]
pub struct TlsError {
    pub key: String,
    pub message: String,
}

impl TlsError {
    fn new(key: impl Into<String>, message: impl Into<String>) -> TlsError {
        TlsError {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Where one listener's certificate comes from: the files and the key that named them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSource {
    /// `tls`, `proxy.tls` or `otlp.tls`.
    pub key: String,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// Both files or neither: one without the other is an error naming the missing key.
fn file_pair(
    key: &str,
    cert: &Option<PathBuf>,
    pk: &Option<PathBuf>,
) -> Result<Option<CertSource>, TlsError> {
    match (cert, pk) {
        (Some(c), Some(k)) => Ok(Some(CertSource {
            key: key.to_string(),
            cert_file: c.clone(),
            key_file: k.clone(),
        })),
        (None, None) => Ok(None),
        (Some(_), None) => Err(TlsError::new(
            format!("{key}.key_file"),
            format!("missing: {key}.cert_file is set without it"),
        )),
        (None, Some(_)) => Err(TlsError::new(
            format!("{key}.cert_file"),
            format!("missing: {key}.key_file is set without it"),
        )),
    }
}

/// The certificate a listener uses: its own (`over`, at `over_key`), else the shared one.
pub fn resolve(
    shared: &TlsConfig,
    over: Option<&ListenerTlsConfig>,
    over_key: &str,
) -> Result<Option<CertSource>, TlsError> {
    let shared_src = file_pair("tls", &shared.cert_file, &shared.key_file)?;
    let Some(o) = over else { return Ok(shared_src) };
    let own = file_pair(over_key, &o.cert_file, &o.key_file)?;
    if !o.enabled {
        return match own {
            Some(_) => Err(TlsError::new(
                format!("{over_key}.enabled"),
                "false, but cert_file and key_file are set: remove them or enable TLS",
            )),
            None => Ok(None),
        };
    }
    match (own, shared_src) {
        (Some(src), _) | (None, Some(src)) => Ok(Some(src)),
        (None, None) => Err(TlsError::new(
            over_key,
            format!(
                "TLS is enabled but no certificate is set: set {over_key}.cert_file and {over_key}.key_file, or the shared tls.cert_file and tls.key_file"
            ),
        )),
    }
}

/// Which certificate each listener uses, per the configuration (none: plain TCP).
#[derive(Debug, Clone, Default)]
pub struct ListenerCerts {
    pub api: Option<CertSource>,
    pub proxy: Option<CertSource>,
    /// Both OTLP listeners (gRPC and HTTP).
    pub otlp: Option<CertSource>,
}

impl ListenerCerts {
    /// The certificates of each listener: the shared `tls:` section, overridden by the proxy's
    /// and the OTLP listeners' own (`proxy.tls`, `otlp.tls`).
    pub fn new(
        shared: &TlsConfig,
        proxy: Option<&ListenerTlsConfig>,
        otlp: Option<&ListenerTlsConfig>,
    ) -> Result<ListenerCerts, TlsError> {
        if shared.reload_interval.0 < Duration::from_millis(100) {
            return Err(TlsError::new(
                "tls.reload_interval",
                "must be at least 100ms",
            ));
        }
        Ok(ListenerCerts {
            api: resolve(shared, None, "tls")?,
            proxy: resolve(shared, proxy, "proxy.tls")?,
            otlp: resolve(shared, otlp, "otlp.tls")?,
        })
    }

    /// Read and check every configured certificate and key (for `check-config` and start-up).
    pub fn check_files(&self) -> Result<(), TlsError> {
        for src in [&self.api, &self.proxy, &self.otlp].into_iter().flatten() {
            load_certified_key(src)?;
        }
        Ok(())
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path, key: &str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path)
        .map_err(|e| TlsError::new(key, format!("cannot read {}: {e}", path.display())))
}

/// Load the chain and key of `src`, checking that they parse and belong together.
pub fn load_certified_key(src: &CertSource) -> Result<CertifiedKey, TlsError> {
    let (cert_key, key_key) = (
        format!("{}.cert_file", src.key),
        format!("{}.key_file", src.key),
    );
    let (cert_name, key_name) = (src.cert_file.display(), src.key_file.display());
    let pem = read(&src.cert_file, &cert_key)?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::new(&cert_key, format!("{cert_name} is not valid PEM: {e}")))?;
    if chain.is_empty() {
        return Err(TlsError::new(
            &cert_key,
            format!("{cert_name} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"),
        ));
    }
    let pem = read(&src.key_file, &key_key)?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        let why = match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "holds no PEM private key (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)"
                    .to_string()
            }
            e => format!("is not a valid PEM private key: {e}"),
        };
        TlsError::new(&key_key, format!("{key_name} {why}"))
    })?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => TlsError::new(
            &key_key,
            format!("{key_name} is not the key of the certificate in {cert_name}"),
        ),
        rustls::Error::General(_) => TlsError::new(
            &key_key,
            format!("{key_name}: unsupported private key: {e}"),
        ),
        e => TlsError::new(&cert_key, format!("{cert_name}: unusable certificate: {e}")),
    })
}

/// Modification time and length of a file (None when it cannot be read).
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    std::fs::metadata(path)
        .ok()
        .and_then(|m| Some((m.modified().ok()?, m.len())))
}

/// One certificate and key pair, served to every listener using it and swapped in place when
/// the files change; handshakes read the current one, established connections keep theirs.
#[derive(Debug)]
pub struct ReloadingCert {
    src: CertSource,
    current: RwLock<Arc<CertifiedKey>>,
    stamps: std::sync::Mutex<(Stamp, Stamp)>,
}

impl ReloadingCert {
    pub fn load(src: CertSource) -> Result<ReloadingCert, TlsError> {
        let stamps = (stamp(&src.cert_file), stamp(&src.key_file));
        let ck = load_certified_key(&src)?;
        Ok(ReloadingCert {
            src,
            current: RwLock::new(Arc::new(ck)),
            stamps: std::sync::Mutex::new(stamps),
        })
    }

    pub fn source(&self) -> &CertSource {
        &self.src
    }

    /// The certificate chain served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reload if either file changed since the last look. A pair that fails to load keeps the
    /// previous certificate and is logged once (until the files change again).
    /// Returns whether a new certificate is now served.
    pub fn reload_if_changed(&self) -> bool {
        let now = (stamp(&self.src.cert_file), stamp(&self.src.key_file));
        {
            let mut seen = self.stamps.lock().unwrap_or_else(|p| p.into_inner());
            if *seen == now {
                return false;
            }
            *seen = now;
        }
        match load_certified_key(&self.src) {
            Ok(ck) => {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(ck);
                tracing::info!(
                    cert_file = %self.src.cert_file.display(),
                    key_file = %self.src.key_file.display(),
                    "TLS certificate reloaded"
                );
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "TLS certificate not reloaded; the previous one is still served");
                false
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// ALPN protocols a listener offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// HTTP/2 and HTTP/1.1 (the API, the proxy, OTLP/HTTP).
    Http,
    /// HTTP/2 only (OTLP/gRPC).
    H2Only,
}

fn server_config(cert: Arc<ReloadingCert>, alpn: Alpn) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::new("tls", format!("cannot set up TLS: {e}")))?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = match alpn {
        Alpn::Http => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        Alpn::H2Only => vec![b"h2".to_vec()],
    };
    Ok(Arc::new(config))
}

/// The server TLS of every listener, loaded: one reloading certificate per distinct file pair.
#[derive(Debug, Default)]
pub struct ServerTls {
    pub api: Option<Arc<ServerConfig>>,
    pub proxy: Option<Arc<ServerConfig>>,
    pub otlp_grpc: Option<Arc<ServerConfig>>,
    pub otlp_http: Option<Arc<ServerConfig>>,
    certs: Vec<Arc<ReloadingCert>>,
    reload_interval: Duration,
}

impl ServerTls {
    /// Load the certificates `wanted` names, reread every `reload_interval`; errors name the
    /// key and the file.
    pub fn load(wanted: ListenerCerts, reload_interval: Duration) -> Result<ServerTls, TlsError> {
        let mut tls = ServerTls {
            reload_interval,
            ..ServerTls::default()
        };
        tls.api = tls.config_for(wanted.api.as_ref(), Alpn::Http)?;
        tls.proxy = tls.config_for(wanted.proxy.as_ref(), Alpn::Http)?;
        tls.otlp_grpc = tls.config_for(wanted.otlp.as_ref(), Alpn::H2Only)?;
        tls.otlp_http = tls.config_for(wanted.otlp.as_ref(), Alpn::Http)?;
        Ok(tls)
    }

    fn config_for(
        &mut self,
        src: Option<&CertSource>,
        alpn: Alpn,
    ) -> Result<Option<Arc<ServerConfig>>, TlsError> {
        let Some(src) = src else { return Ok(None) };
        let same_files = |c: &&Arc<ReloadingCert>| {
            c.src.cert_file == src.cert_file && c.src.key_file == src.key_file
        };
        let cert = match self.certs.iter().find(same_files) {
            Some(c) => c.clone(),
            None => {
                let c = Arc::new(ReloadingCert::load(src.clone())?);
                self.certs.push(c.clone());
                c
            }
        };
        server_config(cert, alpn).map(Some)
    }

    /// Check the certificate files every `tls.reload_interval` until `stop`; None without TLS.
    pub fn spawn_reloader(&self, mut stop: watch::Receiver<bool>) -> Option<JoinHandle<()>> {
        if self.certs.is_empty() {
            return None;
        }
        let certs = self.certs.clone();
        let every = self.reload_interval;
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                let certs = certs.clone();
                let checked = tokio::task::spawn_blocking(move || {
                    for c in &certs {
                        c.reload_if_changed();
                    }
                });
                if let Err(e) = checked.await {
                    tracing::error!(error = %e, "TLS certificate reload check failed");
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(c: &str, k: &str) -> (Option<PathBuf>, Option<PathBuf>) {
        (Some(c.into()), Some(k.into()))
    }

    fn shared(c: Option<&str>, k: Option<&str>) -> TlsConfig {
        TlsConfig {
            cert_file: c.map(PathBuf::from),
            key_file: k.map(PathBuf::from),
            ..TlsConfig::default()
        }
    }

    #[test]
    fn listeners_use_their_own_certificate_else_the_shared_one() {
        let none = shared(None, None);
        assert_eq!(resolve(&none, None, "proxy.tls").unwrap(), None);
        let s = shared(Some("s.crt"), Some("s.key"));
        let got = resolve(&s, None, "proxy.tls").unwrap().unwrap();
        assert_eq!(
            (got.key.as_str(), got.cert_file.to_str().unwrap()),
            ("tls", "s.crt")
        );

        let (cert_file, key_file) = pair("p.crt", "p.key");
        let own = ListenerTlsConfig {
            enabled: true,
            cert_file,
            key_file,
        };
        let got = resolve(&s, Some(&own), "proxy.tls").unwrap().unwrap();
        assert_eq!(
            (got.key.as_str(), got.key_file.to_str().unwrap()),
            ("proxy.tls", "p.key")
        );
        assert_eq!(
            resolve(&none, Some(&own), "proxy.tls")
                .unwrap()
                .unwrap()
                .cert_file,
            PathBuf::from("p.crt")
        );

        let off = ListenerTlsConfig {
            enabled: false,
            cert_file: None,
            key_file: None,
        };
        assert_eq!(resolve(&s, Some(&off), "otlp.tls").unwrap(), None);
        let on = ListenerTlsConfig {
            enabled: true,
            cert_file: None,
            key_file: None,
        };
        assert_eq!(
            resolve(&s, Some(&on), "otlp.tls").unwrap().unwrap().key,
            "tls"
        );
    }

    #[test]
    fn incomplete_settings_name_the_key() {
        let err = resolve(&shared(Some("a.crt"), None), None, "tls").unwrap_err();
        assert_eq!(err.key, "tls.key_file");
        let err = resolve(&shared(None, Some("a.key")), None, "tls").unwrap_err();
        assert_eq!(err.key, "tls.cert_file");
        let on = ListenerTlsConfig {
            enabled: true,
            cert_file: None,
            key_file: None,
        };
        let err = resolve(&shared(None, None), Some(&on), "otlp.tls").unwrap_err();
        assert!(
            err.key == "otlp.tls" && err.message.contains("tls.cert_file"),
            "{err}"
        );
        let (cert_file, key_file) = pair("p.crt", "p.key");
        let off = ListenerTlsConfig {
            enabled: false,
            cert_file,
            key_file,
        };
        assert_eq!(
            resolve(&shared(None, None), Some(&off), "proxy.tls")
                .unwrap_err()
                .key,
            "proxy.tls.enabled"
        );
    }

    #[test]
    fn tls_config_keys_parse_and_unknown_ones_are_rejected() {
        use crate::config::Config;
        let c = Config::from_yaml(
            "tls: {cert_file: null, key_file: null}\nproxy: {tls: null}\n",
            "t.yaml",
        )
        .unwrap();
        assert!(c.tls.cert_file.is_none() && c.proxy.tls.is_none());
        assert_eq!(c.tls.reload_interval.0, Duration::from_secs(10));
        let c = Config::from_yaml(
            "proxy:\n  tls: {enabled: false}\notlp:\n  tls: {enabled: false}\n",
            "t.yaml",
        )
        .unwrap();
        assert!(c.listener_certs().unwrap().proxy.is_none());
        let err = Config::from_yaml("otlp:\n  tls:\n    cert: a.pem\n", "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("key otlp.tls") && err.contains("cert"),
            "{err}"
        );
        let err = Config::from_yaml("tls:\n  reload_interval: 10ms\n", "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("tls.reload_interval"), "{err}");
        let err = Config::from_yaml(
            "tls:\n  cert_file: /nonexistent/c.pem\n  key_file: /nonexistent/k.pem\n",
            "t.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("t.yaml: tls.cert_file: cannot read /nonexistent/c.pem"),
            "{err}"
        );
    }
}
