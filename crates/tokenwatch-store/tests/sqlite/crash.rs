// Crash test (spec section 13): a child process writes batches and acknowledges each commit on
// stdout; the parent SIGKILLs it mid-stream, reopens the store and finds every acknowledged record.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokenwatch_core::model::{RequestRecord, SeriesLabels};
use tokenwatch_store::{RecordQuery, SqliteStore, Store, StoreOptions};

const CHILD_ENV: &str = "TOKENWATCH_STORE_CRASH_WRITER_DIR";
const BATCH: usize = 50;
const KILL_AFTER: usize = 400;

fn record(batch: usize, i: usize) -> RequestRecord {
    RequestRecord {
        request_id: format!("b{batch}-r{i}"),
        labels: SeriesLabels {
            model_id: "crash".into(),
            ..Default::default()
        },
        arrival_unix_ms: (batch * BATCH + i) as i64,
        chunk_offsets_us: (0..32).map(|k| k * 1000).collect(),
        end_s: 1.0,
        status: 200,
        ..Default::default()
    }
}

/// The writer: runs only when spawned by `acknowledged_records_survive_sigkill`; writes until
/// killed (or a safety cap), printing `committed <batches>` after each acknowledged batch.
#[test]
fn crash_writer_child() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let store = SqliteStore::open(Path::new(&dir), StoreOptions::default()).unwrap();
    let started = Instant::now();
    for batch in 0.. {
        let records: Vec<_> = (0..BATCH).map(|i| record(batch, i)).collect();
        store.insert_records(&records).unwrap();
        println!("committed {}", batch + 1);
        if started.elapsed() > Duration::from_secs(20) {
            break; // the parent is gone; don't write forever
        }
    }
}

#[test]
fn acknowledged_records_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash::crash_writer_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acked = 0usize;
    // Kill once the writer is well into its stream (past a WAL auto-checkpoint at ~4 MiB),
    // after a small jitter so the kill lands at varying points of a batch.
    while acked < KILL_AFTER {
        let line = lines.next().expect("writer ended early").unwrap();
        if let Some(n) = line.strip_prefix("committed ") {
            acked = n.parse().unwrap();
        }
    }
    std::thread::sleep(Duration::from_micros(u64::from(std::process::id() % 3000)));
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();
    // Acknowledgements already in the pipe were commits too.
    for line in lines.map_while(Result::ok) {
        if let Some(n) = line.strip_prefix("committed ") {
            acked = n.parse().unwrap();
        }
    }

    let store = SqliteStore::open(dir.path(), StoreOptions::default()).unwrap();
    let q = RecordQuery {
        model: Some("crash".into()),
        limit: usize::MAX,
        ..RecordQuery::default()
    };
    let got = store.query_records(&q).unwrap();
    eprintln!(
        "killed after {acked} acknowledged batches; {} records on disk",
        got.len()
    );
    let present: std::collections::HashSet<_> = got.iter().map(|r| r.request_id.as_str()).collect();
    for batch in 0..acked {
        for i in 0..BATCH {
            let want = record(batch, i);
            assert!(
                present.contains(want.request_id.as_str()),
                "lost acknowledged {}",
                want.request_id
            );
        }
    }
    // At most the batch in flight when killed may also be there, and only whole.
    assert_eq!(got.len() % BATCH, 0, "a batch is all or nothing");
    assert!(
        got.len() <= (acked + 1) * BATCH,
        "{} records for {acked} batches",
        got.len()
    );
    assert_eq!(got.last().unwrap(), &record(0, 0));
}
