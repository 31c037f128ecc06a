// The ClickHouse HTTP interface, blocking (the store runs on store threads): queries in the body,
// inserts as RowBinary bodies, http:// or https:// (rustls: system roots plus a CA file), server
// errors parsed — also one appended to a 200 answer after streaming began — and transient
// failures retried with backoff.
//
// Why not the official `clickhouse` crate (0.13/0.14): it is async only (hyper + tokio), and the
// store is called from blocking store threads, which would need a runtime per store or a
// `block_on` per call; its RowBinary mapping goes through serde derives per row type, where these
// tables are written and read column by column from existing types (rowbinary.rs, ~250 lines);
// and it offers nothing measured here to gain: RowBinary encoding is 10–16 % of an insert's time
// even in a debug build, the rest HTTP and the server (200,000 records in batches of 5,000,
// `testing::compare_record_schemas`; BENCHMARKS.md, ClickHouse schema 5 vs 6). It has TLS, LZ4 and an inserter;
// this client has TLS (below), RowBinary, deduplication tokens, query parameters and the
// mid-stream exception check, which is what the store needs.

use crate::StoreError;
use crate::clickhouse::ClickHouseConfig;
use base64::Engine;
use std::io::ErrorKind;
use std::time::{Duration, Instant};
use tokenwatch_core::backoff::Backoff;

/// Largest response read (a query answer); beyond it the query fails rather than eat memory.
const MAX_RESPONSE_BYTES: u64 = 1 << 30;
/// First wait between two attempts; doubled each time up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// ClickHouse error codes worth retrying: timeouts, too many queries or parts, network errors,
/// memory pressure, a read-only table (a replica catching up).
const TRANSIENT_CODES: &[i64] = &[159, 202, 203, 209, 210, 241, 242, 252];

/// Whether a request may be repeated after an unknown outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Reads and DDL: any transport failure is retried.
    Idempotent,
    /// Inserts: retried only when the request surely was not processed (no connection, or
    /// the server answered with a transient error), so a retry never duplicates rows.
    NotSent,
}

pub(crate) struct Client {
    agent: ureq::Agent,
    base: String,
    database: String,
    auth: Option<String>,
    retry_for: Duration,
    /// `clickhouse URL (database NAME)`, for error messages.
    label: String,
    /// One node or a cluster: how schema statements are written (`cluster`).
    layout: super::cluster::Layout,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No credentials here: the password never reaches a log line.
        f.debug_struct("Client")
            .field("label", &self.label)
            .finish()
    }
}

impl Client {
    pub(crate) fn new(
        cfg: &ClickHouseConfig,
        password: Option<&str>,
    ) -> Result<Client, StoreError> {
        let base = cfg.url.trim_end_matches('/').to_string();
        let (rest, https) = match (base.strip_prefix("http://"), base.strip_prefix("https://")) {
            (Some(rest), _) => (rest, false),
            (None, Some(rest)) => (rest, true),
            (None, None) => {
                return Err(StoreError::Config(format!(
                    "clickhouse url {:?}: expected http://host:port or https://host:port",
                    cfg.url
                )));
            }
        };
        if rest.is_empty() || rest.contains(['@', '?', '#']) {
            return Err(StoreError::Config(format!(
                "clickhouse url {:?}: expected http(s)://host:port without user info or query",
                cfg.url
            )));
        }
        if cfg.ca_file.is_some() && !https {
            return Err(StoreError::Config(format!(
                "clickhouse ca_file is set but the url {:?} is not https://",
                cfg.url
            )));
        }
        let layout = super::cluster::Layout::new(cfg.cluster.as_deref())?;
        if !valid_identifier(&cfg.database) {
            return Err(StoreError::Config(format!(
                "clickhouse database {:?}: letters, digits and _ only, not starting with a digit",
                cfg.database
            )));
        }
        let auth = if cfg.user.is_empty() && password.is_none() {
            None
        } else {
            let pair = format!("{}:{}", cfg.user, password.unwrap_or(""));
            Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            ))
        };
        let tls = if https {
            tls_config(cfg.ca_file.as_deref())?
        } else {
            ureq::tls::TlsConfig::default()
        };
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(2)))
            .timeout_global(Some(cfg.timeout))
            // Below the server's keep-alive (10 s by default), so a pooled connection is not
            // found closed by the server in the middle of an insert.
            .max_idle_age(Duration::from_secs(5))
            .build()
            .into();
        Ok(Client {
            agent,
            label: format!("clickhouse {base} (database {})", cfg.database),
            base,
            database: cfg.database.clone(),
            auth,
            retry_for: cfg.retry_for,
            layout,
        })
    }

    pub(crate) fn layout(&self) -> &super::cluster::Layout {
        &self.layout
    }

    /// Runs a schema or retention statement written for one server in this layout's form
    /// (`cluster::Layout::statements`: on a cluster, `ON CLUSTER` against the local tables).
    pub(crate) fn ddl(
        &self,
        op: &'static str,
        sql: &str,
        in_database: bool,
    ) -> Result<(), StoreError> {
        for st in self.layout.statements(sql)? {
            self.query(op, &st, in_database)?;
        }
        Ok(())
    }

    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    pub(crate) fn database(&self) -> &str {
        &self.database
    }

    /// Run one statement (the SQL is the request body) and return the response body. With
    /// `in_database` false the statement runs without a current database (creating it).
    pub(crate) fn query(
        &self,
        op: &'static str,
        sql: &str,
        in_database: bool,
    ) -> Result<Vec<u8>, StoreError> {
        self.query_with(op, sql, &Params::default(), in_database)
    }

    /// As `query`, with the values of the SQL's `{pN:Type}` placeholders sent as `param_pN`.
    pub(crate) fn query_with(
        &self,
        op: &'static str,
        sql: &str,
        params: &Params,
        in_database: bool,
    ) -> Result<Vec<u8>, StoreError> {
        let url = Url {
            query: None,
            params: &params.list,
            dedup_token: None,
        };
        self.request(op, url, sql.as_bytes(), in_database, Retry::Idempotent)
    }

    /// `INSERT INTO table (columns) FORMAT RowBinary` with `rows` (RowBinary-encoded) as body,
    /// under an `insert_deduplication_token` derived from the rows: the tables keep a
    /// deduplication window (`non_replicated_deduplication_window`, replicated tables always),
    /// so a batch repeated after an unknown outcome (a timeout, a connection lost mid-answer)
    /// is stored once, and such failures are retried like reads.
    pub(crate) fn insert(
        &self,
        op: &'static str,
        table: &str,
        columns: &str,
        rows: &[u8],
    ) -> Result<(), StoreError> {
        let token = dedup_token(table, rows);
        self.insert_rows(op, (table, columns), rows, Some(&token), Retry::Idempotent)
    }

    /// An insert into a table without a deduplication window (`schema_migrations`): retried
    /// only when the request surely was not processed, so a retry never duplicates rows.
    pub(crate) fn insert_once(
        &self,
        op: &'static str,
        table: &str,
        columns: &str,
        rows: &[u8],
    ) -> Result<(), StoreError> {
        self.insert_rows(op, (table, columns), rows, None, Retry::NotSent)
    }

    /// `INSERT INTO table (columns) FORMAT RowBinary` with `rows` as body, under `dedup_token`
    /// when given, retried as `retry` says.
    fn insert_rows(
        &self,
        op: &'static str,
        (table, columns): (&str, &str),
        rows: &[u8],
        dedup_token: Option<&str>,
        retry: Retry,
    ) -> Result<(), StoreError> {
        let sql = format!(
            "INSERT INTO {}.{table} ({columns}) FORMAT RowBinary",
            self.database
        );
        let url = Url {
            query: Some(&sql),
            params: &[],
            dedup_token,
        };
        self.request(op, url, rows, true, retry).map(|_| ())
    }

    fn request(
        &self,
        op: &'static str,
        url: Url<'_>,
        body: &[u8],
        in_database: bool,
        retry: Retry,
    ) -> Result<Vec<u8>, StoreError> {
        let deadline = Instant::now() + self.retry_for;
        let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_BACKOFF);
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let outcome = self.send_once(&url, body, in_database);
            let (err, transient) = match outcome {
                Ok((200, bytes)) => match exception_after_200(&bytes) {
                    None => return Ok(bytes),
                    // The server failed after it had sent the 200 and part of the answer.
                    Some((code, message)) => {
                        let err = StoreError::Server {
                            database: self.label.clone(),
                            op,
                            status: 200,
                            code: Some(code),
                            message: truncate(message, 2000),
                        };
                        (err, TRANSIENT_CODES.contains(&code))
                    }
                },
                Ok((status, bytes)) => {
                    let text = String::from_utf8_lossy(&bytes).trim().to_string();
                    let code = error_code(&text);
                    let transient = matches!(status, 502..=504)
                        || code.is_some_and(|c| TRANSIENT_CODES.contains(&c));
                    let err = StoreError::Server {
                        database: self.label.clone(),
                        op,
                        status,
                        code,
                        message: truncate(text, 2000),
                    };
                    (err, transient)
                }
                Err(e) => {
                    let transient = retryable(&e, retry);
                    let err = if is_transport(&e) {
                        StoreError::Unreachable {
                            database: self.label.clone(),
                            op,
                            attempts,
                            source: Box::new(e),
                        }
                    } else {
                        StoreError::Backend {
                            database: self.label.clone(),
                            op,
                            source: Box::new(e),
                        }
                    };
                    (err, transient)
                }
            };
            if !transient || Instant::now() + backoff.peek() > deadline {
                return Err(err);
            }
            tracing::debug!(database = %self.label, op, attempts, error = %err, "retrying");
            std::thread::sleep(backoff.next_delay());
        }
    }

    fn send_once(
        &self,
        url: &Url<'_>,
        body: &[u8],
        in_database: bool,
    ) -> Result<(u16, Vec<u8>), ureq::Error> {
        let mut req = self.agent.post(format!("{}/", self.base));
        if in_database {
            req = req.query("database", &self.database);
        }
        if let Some(q) = url.query {
            req = req.query("query", q);
        } else {
            // A read's answer is buffered by the server until the query ends, so a failure
            // midway is an HTTP error, not a 200 with the exception appended (still checked).
            req = req.query("wait_end_of_query", "1");
        }
        if let Some(t) = url.dedup_token {
            req = req.query("insert_deduplication_token", t);
        }
        for (name, value) in url.params {
            req = req.query(name, value);
        }
        if let Some(auth) = &self.auth {
            req = req.header("Authorization", auth);
        }
        let mut resp = req.send(body)?;
        let status = resp.status().as_u16();
        let bytes = resp
            .body_mut()
            .with_config()
            .limit(MAX_RESPONSE_BYTES)
            .read_to_vec()?;
        Ok((status, bytes))
    }
}

/// Trusted roots for https://: the system's (rustls-native-certs) and `ca_file`'s; Mozilla's
/// (webpki-roots) when the system has none and no CA file is given.
fn tls_config(ca_file: Option<&std::path::Path>) -> Result<ureq::tls::TlsConfig, StoreError> {
    use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};
    let mut roots: Vec<Certificate<'static>> = rustls_native_certs::load_native_certs()
        .certs
        .into_iter()
        .map(|c| Certificate::from_der(c.as_ref()).to_owned())
        .collect();
    if let Some(path) = ca_file {
        let pem = std::fs::read(path).map_err(|e| {
            StoreError::Config(format!("clickhouse ca_file {}: {e}", path.display()))
        })?;
        let before = roots.len();
        for item in ureq::tls::parse_pem(&pem) {
            match item {
                Ok(PemItem::Certificate(c)) => roots.push(c.to_owned()),
                Ok(_) => {}
                Err(e) => {
                    return Err(StoreError::Config(format!(
                        "clickhouse ca_file {}: {e}",
                        path.display()
                    )));
                }
            }
        }
        if roots.len() == before {
            return Err(StoreError::Config(format!(
                "clickhouse ca_file {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                path.display()
            )));
        }
    }
    let roots = if roots.is_empty() {
        RootCerts::WebPki
    } else {
        RootCerts::Specific(std::sync::Arc::new(roots))
    };
    Ok(TlsConfig::builder().root_certs(roots).build())
}

/// An exception ClickHouse appended to an answer it had begun with 200 (`Code: N.
/// DB::Exception: ... (version V)` at the end of the body, and in 25.x+ between
/// `__exception__` markers): its code and text. Only a well-formed exception that ends the
/// body counts; the RowBinary answers read here never end in text.
fn exception_after_200(body: &[u8]) -> Option<(i64, String)> {
    const TAIL: usize = 64 * 1024;
    let tail = &body[body.len().saturating_sub(TAIL)..];
    let start = memfind_last(tail, b"Code: ")?;
    let text = std::str::from_utf8(&tail[start..]).ok()?;
    let code = error_code(text)?;
    let rest = text["Code: ".len()..].trim_start_matches(|c: char| c.is_ascii_digit());
    if !(rest.starts_with(". DB::Exception:")
        || rest.starts_with(", e.displayText() = DB::Exception:"))
    {
        return None;
    }
    let (line, after) = text.split_once('\n').unwrap_or((text, ""));
    let line = line.trim_end();
    let ends_body = after.trim().is_empty() || after.contains("__exception__");
    (line.ends_with(')') && ends_body).then(|| (code, line.to_string()))
}

fn memfind_last(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).rposition(|w| w == needle)
}

/// What a request carries on its URL besides the database.
struct Url<'a> {
    /// The statement, when the body is an INSERT's data.
    query: Option<&'a str>,
    /// `param_NAME=value` pairs.
    params: &'a [(String, String)],
    dedup_token: Option<&'a str>,
}

/// The same rows into the same table give the same token (a retried batch); rows carry a
/// per-process increasing `seq`, so two different batches never share one.
fn dedup_token(table: &str, rows: &[u8]) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    rows.hash(&mut h);
    format!("tw-{table}-{}-{:016x}", rows.len(), h.finish())
}

/// Query parameters: the SQL names a value `{pN:Type}` and the value travels as `param_pN=` on
/// the URL, parsed by the server as data of that type — never spliced into SQL text. (DDL
/// cannot take parameters: the TTL and retention statements quote their few literals.)
#[derive(Default)]
pub(crate) struct Params {
    list: Vec<(String, String)>,
}

impl Params {
    fn add(&mut self, ty: &str, value: String) -> String {
        let name = format!("p{}", self.list.len());
        let placeholder = format!("{{{name}:{ty}}}");
        self.list.push((format!("param_{name}"), value));
        placeholder
    }

    /// A `String` (the value in the escaped text format: `\`, tab, newline escaped).
    pub(crate) fn str(&mut self, v: &str) -> String {
        self.add("String", escape_text(v))
    }

    pub(crate) fn i64(&mut self, v: i64) -> String {
        self.add("Int64", v.to_string())
    }

    pub(crate) fn u64(&mut self, v: u64) -> String {
        self.add("UInt64", v.to_string())
    }

    pub(crate) fn f64(&mut self, v: f64) -> String {
        self.add("Float64", format!("{v:?}"))
    }

    /// An `Array(String)`, for `col IN {pN:Array(String)}`.
    pub(crate) fn strs<'a>(&mut self, items: impl IntoIterator<Item = &'a str>) -> String {
        self.add("Array(String)", format!("[{}]", quote_list(items)))
    }

    /// Unix milliseconds as a `DateTime64(3, 'UTC')` expression (any i64: a reinterpretation).
    pub(crate) fn ms(&mut self, v: i64) -> String {
        format!("fromUnixTimestamp64Milli({}, 'UTC')", self.i64(v))
    }

    /// Unix nanoseconds as a `DateTime64(9, 'UTC')` expression.
    pub(crate) fn ns(&mut self, v: i64) -> String {
        format!("fromUnixTimestamp64Nano({}, 'UTC')", self.i64(v))
    }
}

/// A value in ClickHouse's escaped text format (what a `param_` value is parsed as).
fn escape_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            c => out.push(c),
        }
    }
    out
}

/// A database or table name usable unquoted.
pub(crate) fn valid_identifier(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `Code: 60, e.displayText() = ...` → 60.
fn error_code(text: &str) -> Option<i64> {
    let rest = text.strip_prefix("Code: ")?;
    let end = rest.find(|c: char| !c.is_ascii_digit())?;
    rest[..end].parse().ok()
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// The server could not be reached or the connection broke.
fn is_transport(e: &ureq::Error) -> bool {
    matches!(
        e,
        ureq::Error::Io(_)
            | ureq::Error::Timeout(_)
            | ureq::Error::HostNotFound
            | ureq::Error::ConnectionFailed
    )
}

fn retryable(e: &ureq::Error, retry: Retry) -> bool {
    use ureq::Timeout;
    let not_sent = match e {
        ureq::Error::Io(io) => io.kind() == ErrorKind::ConnectionRefused,
        ureq::Error::HostNotFound | ureq::Error::ConnectionFailed => true,
        ureq::Error::Timeout(t) => matches!(t, Timeout::Connect | Timeout::Resolve),
        _ => false,
    };
    not_sent || (retry == Retry::Idempotent && is_transport(e))
}

/// A SQL string literal: `'` and `\` escaped with a backslash (DDL, which takes no parameters,
/// and the elements of an `Array(String)` parameter).
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\'' => out.push_str("\\'"),
            '\\' => out.push_str("\\\\"),
            '\0' => out.push_str("\\0"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// `'a', 'b', 'c'` for an `IN (...)` list.
pub(crate) fn quote_list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    items.into_iter().map(quote).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_are_read_from_server_messages() {
        let m = "Code: 60, e.displayText() = DB::Exception: Table default.nope doesn't exist.";
        assert_eq!(error_code(m), Some(60));
        assert_eq!(error_code("Bad Gateway"), None);
    }

    #[test]
    fn literals_are_escaped() {
        assert_eq!(quote("a'b\\c"), r"'a\'b\\c'");
        assert_eq!(quote_list(["x", "y"]), "'x', 'y'");
    }

    #[test]
    fn urls_and_databases_are_checked() {
        let cfg = |url: &str, db: &str| ClickHouseConfig {
            url: url.into(),
            database: db.into(),
            ..Default::default()
        };
        assert!(Client::new(&cfg("http://127.0.0.1:8123/", "tw"), None).is_ok());
        assert!(Client::new(&cfg("https://h.clickhouse.cloud:8443", "tw"), None).is_ok());
        for (url, db) in [
            ("ftp://h:1", "tw"),
            ("127.0.0.1:8123", "tw"),
            ("http://u:p@h:1", "tw"),
            ("http://h:1", "tw-x"),
            ("http://h:1", "1tw"),
        ] {
            let err = Client::new(&cfg(url, db), None).unwrap_err().to_string();
            assert!(err.contains("clickhouse"), "{err}");
        }
    }

    /// A one-address HTTP server answering every request with `answer`; counts requests.
    fn fake_server(answer: Vec<u8>) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = hits.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                counted.fetch_add(1, Ordering::SeqCst);
                // The request: headers, then Content-Length bytes of body.
                let mut req = Vec::new();
                let mut byte = [0u8; 1];
                while !req.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                    req.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&req).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                let mut body = vec![0u8; len];
                let _ = conn.read_exact(&mut body);
                let _ = conn.write_all(&answer);
            }
        });
        (url, hits)
    }

    /// ClickHouse's answer when a query fails after streaming began: 200, chunked, rows, then
    /// the exception text in the body.
    fn failed_after_200(exception: &str) -> Vec<u8> {
        let mut out = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\
            X-ClickHouse-Format: RowBinary\r\nTransfer-Encoding: chunked\r\n\
            Connection: close\r\n\r\n"
            .to_vec();
        for chunk in [
            &b"\x01\x00\x00\x00\x00\x00\x00\x00"[..],
            exception.as_bytes(),
        ] {
            out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            out.extend_from_slice(chunk);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    }

    #[test]
    fn an_exception_after_a_200_is_an_error_and_a_transient_one_is_retried() {
        let (url, hits) = fake_server(failed_after_200(
            "Code: 241. DB::Exception: Memory limit (for query) exceeded: would use 9.31 GiB. \
             (MEMORY_LIMIT_EXCEEDED) (version 24.8.4.13 (official build))\n",
        ));
        let cfg = ClickHouseConfig {
            url,
            retry_for: Duration::from_millis(300),
            ..Default::default()
        };
        let client = Client::new(&cfg, None).unwrap();
        let err = client.query("query_records", "SELECT 1", true).unwrap_err();
        match &err {
            StoreError::Server {
                status,
                code,
                message,
                ..
            } => {
                assert_eq!((*status, *code), (200, Some(241)), "{err}");
                assert!(message.contains("MEMORY_LIMIT_EXCEEDED"), "{err}");
            }
            other => panic!("not a server error: {other:?}"),
        }
        let n = hits.load(std::sync::atomic::Ordering::SeqCst);
        assert!(n >= 2, "code 241 is transient: retried ({n} requests)");
    }

    #[test]
    fn a_permanent_exception_after_a_200_is_reported_at_once() {
        let (url, hits) = fake_server(failed_after_200(
            "Code: 60. DB::Exception: Table tw.records_v6 does not exist. (UNKNOWN_TABLE) \
             (version 26.9.2.1)\n",
        ));
        let cfg = ClickHouseConfig {
            url,
            retry_for: Duration::from_secs(5),
            ..Default::default()
        };
        let client = Client::new(&cfg, None).unwrap();
        let err = client.query("query_records", "SELECT 1", true).unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Server {
                    status: 200,
                    code: Some(60),
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn exceptions_are_told_from_data() {
        let exc =
            b"Code: 60. DB::Exception: Table x does not exist. (UNKNOWN_TABLE) (version 26.9.2.1)";
        let mut body = b"\x03abc".to_vec();
        body.extend_from_slice(exc);
        body.push(b'\n');
        assert_eq!(exception_after_200(&body).map(|e| e.0), Some(60));
        // 25.x+: the exception between markers.
        let mut tagged = b"\x03abc__exception__\r\nq1w2\r\n".to_vec();
        tagged.extend_from_slice(exc);
        tagged.extend_from_slice(b"\n86 q1w2\r\n__exception__\r\n");
        assert_eq!(exception_after_200(&tagged).map(|e| e.0), Some(60));
        // The same text inside the data, followed by more rows, is data.
        let mut inside = body.clone();
        inside.extend_from_slice(b"\x00\x01\x02");
        assert_eq!(exception_after_200(&inside), None);
        assert_eq!(exception_after_200(b""), None);
        assert_eq!(exception_after_200(b"\x01\x00\x00\x00"), None);
    }

    #[test]
    fn ca_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let cfg = |url: &str, ca: &std::path::Path| ClickHouseConfig {
            url: url.into(),
            ca_file: Some(ca.to_path_buf()),
            ..Default::default()
        };
        let err = Client::new(&cfg("https://h:8443", &empty), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("holds no PEM certificate"), "{err}");
        let err = Client::new(&cfg("https://h:8443", &dir.path().join("nope")), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("ca_file") && err.contains("nope"), "{err}");
        let err = Client::new(&cfg("http://h:8123", &empty), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not https://"), "{err}");
    }

    #[test]
    fn refused_connections_fail_within_the_retry_budget() {
        // A port nothing listens on: bind, read the port, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = ClickHouseConfig {
            url: format!("http://127.0.0.1:{port}"),
            retry_for: Duration::from_millis(400),
            ..Default::default()
        };
        let client = Client::new(&cfg, None).unwrap();
        let started = Instant::now();
        let err = client.query("ping", "SELECT 1", true).unwrap_err();
        let took = started.elapsed();
        assert!(took < Duration::from_secs(3), "{took:?}");
        match &err {
            StoreError::Unreachable { attempts, .. } => assert!(*attempts >= 2, "{err}"),
            other => panic!("not Unreachable: {other:?}"),
        }
        assert!(err.to_string().contains(&cfg.url), "{err}");
    }
}
