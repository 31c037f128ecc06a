// A throwaway ClickHouse server for tests: ClickHouse 26.9 through the repository's chDB stand-in
// (scripts/clickhouse-chdb) started on free loopback ports with its own data directory, killed
// and removed on Drop.

use crate::clickhouse::ClickHouseConfig;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Names another `clickhouse-server`-compatible binary (taking `--config-file=FILE`) to test against.
const SERVER_ENV: &str = "TOKENWATCH_CLICKHOUSE_SERVER";

/// The server binary: `$TOKENWATCH_CLICKHOUSE_SERVER`, else the repository's stand-in (found from
/// this crate's source directory, so it works from any clone without a PATH entry).
fn server_binary() -> PathBuf {
    match std::env::var_os(SERVER_ENV) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../scripts/clickhouse-chdb/bin/clickhouse-server"),
    }
}

/// A loopback port free now, taken below the kernel's ephemeral range (so no outgoing
/// connection is given it before the server binds it), checked by binding.
pub fn free_loopback_addr() -> SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        (std::process::id().wrapping_mul(7919).wrapping_add(6007)) % SPAN,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..SPAN {
        let port = LOW + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port as u16)) {
            return l.local_addr().expect("local address of a bound socket");
        }
    }
    panic!("no free loopback port in {LOW}..{}", LOW + SPAN)
}

/// A running server (HTTP on `http`; `tcp` is configured for a real clickhouse-server's native
/// protocol, unused by the stand-in).
pub struct ClickHouseServer {
    child: Child,
    dir: PathBuf,
    pub http: SocketAddr,
    pub tcp: SocketAddr,
}

impl ClickHouseServer {
    /// Start on free ports; panics naming the log when it is not answering `/ping` in 30 s.
    pub fn start() -> ClickHouseServer {
        for attempt in 0..3 {
            match ClickHouseServer::try_start(free_loopback_addr(), free_loopback_addr()) {
                Ok(s) => return s,
                // A port taken between the check and the server's bind: try other ports.
                Err(log) if attempt < 2 && log.contains("Address already in use") => continue,
                Err(log) => panic!("clickhouse-server did not start; its log:\n{log}"),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// Start on the given loopback addresses; Err carries the server's log.
    pub fn try_start(http: SocketAddr, tcp: SocketAddr) -> Result<ClickHouseServer, String> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("tw-clickhouse-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let d = dir.display();
        let config = format!(
            r#"<?xml version="1.0"?>
<clickhouse>
    <logger><level>warning</level><console>1</console></logger>
    <http_port>{http_port}</http_port>
    <tcp_port>{tcp_port}</tcp_port>
    <listen_host>127.0.0.1</listen_host>
    <path>{d}/data/</path>
    <tmp_path>{d}/tmp/</tmp_path>
    <user_files_path>{d}/user_files/</user_files_path>
    <format_schema_path>{d}/format_schemas/</format_schema_path>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mark_cache_size>268435456</mark_cache_size>
    <uncompressed_cache_size>268435456</uncompressed_cache_size>
    <max_concurrent_queries>20</max_concurrent_queries>
</clickhouse>
"#,
            http_port = http.port(),
            tcp_port = tcp.port(),
        );
        let config_file = dir.join("config.xml");
        std::fs::write(&config_file, config).map_err(|e| e.to_string())?;
        let log_file = dir.join("server.log");
        let log = std::fs::File::create(&log_file).map_err(|e| e.to_string())?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let server = server_binary();
        let child = Command::new(&server)
            .arg(format!("--config-file={}", config_file.display()))
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| {
                format!(
                    "starting {}: {e} — run the README's test command (scripts/test.sh), which \
                     creates .venv-chdb with the pinned chdb the stand-in needs",
                    server.display()
                )
            })?;
        let mut server = ClickHouseServer {
            child,
            dir,
            http,
            tcp,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if ping(http) {
                return Ok(server);
            }
            let exited = matches!(server.child.try_wait(), Ok(Some(_)));
            if exited || Instant::now() > deadline {
                return Err(server.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.http)
    }

    /// A store configuration for `database` on this server (short retries: tests), without
    /// TTLs: the tests' rows are of any date, and their retention runs at the time they give.
    pub fn config(&self, database: &str) -> ClickHouseConfig {
        ClickHouseConfig {
            url: self.url(),
            database: database.into(),
            retry_for: Duration::from_secs(5),
            ttl: false,
            ..ClickHouseConfig::default()
        }
    }

    /// Runs one statement over HTTP and returns the answer as text; panics on an error.
    pub fn query(&self, sql: &str) -> String {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut resp = agent
            .post(format!("{}/", self.url()))
            .send(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let status = resp.status().as_u16();
        let body = resp.body_mut().read_to_string().unwrap_or_default();
        assert_eq!(status, 200, "{sql}: {body}");
        body
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

fn ping(http: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = TcpStream::connect_timeout(&http, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"GET /ping HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    text.starts_with("HTTP/1.") && text.contains(" 200 ") && text.ends_with("Ok.\n")
}

impl Drop for ClickHouseServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One schema's figures in [`compare_record_schemas`].
#[derive(Debug, Clone, PartialEq)]
pub struct SchemaFigures {
    /// `records` (schema version 5) or `records_v6`.
    pub table: &'static str,
    pub records: u64,
    /// Records per second of the inserts (RowBinary encoding included).
    pub records_per_s: f64,
    /// Share of the insert time spent encoding RowBinary in this process (the rest: HTTP and
    /// the server).
    pub encode_share: f64,
    /// Active parts' bytes on disk after `OPTIMIZE ... FINAL`, per record.
    pub bytes_per_record: f64,
    /// Rows the server would read to find one record by request id, after the primary key
    /// and the skip indexes (`EXPLAIN ESTIMATE`; the stand-in's `X-ClickHouse-Summary` counts
    /// result rows, not rows read).
    pub lookup_read_rows: u64,
}

/// Inserts `records` in batches of `batch` into the records table of schema version 5 and of
/// the current schema side by side (the same RowBinary rows, batches alternating) in database
/// `db` of `server`, and measures both: insert rate, bytes on disk per record, rows read by a
/// lookup of `lookup_id`. For the store-insert benchmark.
pub fn compare_record_schemas(
    server: &ClickHouseServer,
    db: &str,
    records: &[tokenwatch_core::model::RequestRecord],
    batch: usize,
    lookup_id: &str,
) -> Result<[SchemaFigures; 2], crate::StoreError> {
    use crate::clickhouse::{bench_support, client::Client};
    let client = Client::new(&server.config(db), None)?;
    bench_support::create_v5_and_v6_records(&client)?;
    let tables: [&'static str; 2] = ["records", crate::clickhouse::schema_records_table()];
    let mut spent = [Duration::ZERO; 2];
    let mut encoding = [Duration::ZERO; 2];
    for (n, chunk) in records.chunks(batch.max(1)).enumerate() {
        for (i, table) in tables.iter().enumerate() {
            let started = Instant::now();
            let body = bench_support::encode_records(chunk, (n * batch) as u64 + 1);
            encoding[i] += started.elapsed();
            client.insert(
                "benchmark insert",
                table,
                bench_support::RECORD_COLUMNS,
                &body,
            )?;
            spent[i] += started.elapsed();
        }
    }
    let mut out = Vec::new();
    for (i, table) in tables.iter().enumerate() {
        self::optimize(server, db, table);
        let parts = server.query(&format!(
            "SELECT sum(rows), sum(bytes_on_disk) FROM system.parts WHERE database = '{db}' \
             AND table = '{table}' AND active FORMAT TSV"
        ));
        let mut cols = parts
            .split_whitespace()
            .map(|v| v.parse::<u64>().unwrap_or(0));
        let (rows, bytes) = (cols.next().unwrap_or(0), cols.next().unwrap_or(0));
        out.push(SchemaFigures {
            table,
            records: rows,
            records_per_s: records.len() as f64 / spent[i].as_secs_f64().max(1e-9),
            encode_share: encoding[i].as_secs_f64() / spent[i].as_secs_f64().max(1e-9),
            bytes_per_record: bytes as f64 / rows.max(1) as f64,
            lookup_read_rows: server
                .query(&format!(
                    "EXPLAIN ESTIMATE SELECT request_id, end_s FROM {db}.{table} \
                     WHERE request_id = '{lookup_id}' FORMAT TSV"
                ))
                .lines()
                .filter_map(|l| l.split('\t').nth(3)?.parse::<u64>().ok())
                .sum(),
        });
    }
    Ok([out[0].clone(), out[1].clone()])
}

fn optimize(server: &ClickHouseServer, db: &str, table: &str) {
    server.query(&format!("OPTIMIZE TABLE {db}.{table} FINAL"));
}
