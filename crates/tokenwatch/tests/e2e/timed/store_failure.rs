// Fail open against a failing embedded store (issue 28, item 3): in one `role: all` process,
// the SQLite store stops taking writes while streams flow — another process holds the database
// in an exclusive transaction (as a `sqlite3` shell or a backup tool left mid-transaction would),
// so every write waits out SQLite's busy timeout and fails. The forwarded streams must not
// notice: every one completes at the latency it had before, the lost records are counted one by
// one, and the store takes writes again once the lock is gone.

use crate::common;
use crate::timed::proxy_roles::{Seen, assert_fails_open, traffic};

use common::*;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MODEL: &str = "sim-llama-8b";

/// A Python process holding `db` in an exclusive SQLite transaction until dropped.
struct Locker(Child);

impl Locker {
    fn lock(db: &std::path::Path) -> Locker {
        let script = "import sqlite3, sys\n\
                      con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)\n\
                      con.execute('BEGIN EXCLUSIVE')\n\
                      print('locked', flush=True)\n\
                      sys.stdin.read()\n\
                      con.execute('ROLLBACK')\n";
        let mut child = Command::new(python())
            .arg("-c")
            .arg(script)
            .arg(db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the Python that locks the database");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "locked", "the database was not locked");
        Locker(child)
    }

    /// Ends the transaction (stdin closed) and waits for the process.
    fn release(mut self) {
        drop(self.0.stdin.take());
        let status = self.0.wait().unwrap();
        assert!(status.success(), "the locking process failed: {status}");
    }
}

impl Drop for Locker {
    fn drop(&mut self) {
        if let Some(mut stdin) = self.0.stdin.take() {
            let _ = stdin.flush();
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn metrics(api: SocketAddr) -> String {
    get(&format!("http://{api}/metrics")).await.body
}

fn value(m: &str, series: &str) -> f64 {
    metric_value(m, series).unwrap_or(0.0)
}

/// Records the store lost: failed writes and a full write queue.
fn lost(m: &str) -> f64 {
    value(
        m,
        "tokenwatch_store_records_dropped_total{reason=\"write_failed\"}",
    ) + value(
        m,
        "tokenwatch_store_records_dropped_total{reason=\"queue_full\"}",
    )
}

async fn stored(api: SocketAddr) -> usize {
    let v = get(&format!(
        "http://{api}/api/v1/requests?model={MODEL}&limit=10000"
    ))
    .await
    .json();
    v["requests"].as_array().map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_flow_untouched_while_the_store_fails_and_every_lost_record_is_counted() {
    let stack = Stack::start(&["--ttft-ms", "40", "--itl-ms", "10"], &[]).await;
    let (api, proxy) = (stack.api, stack.proxy);
    let (n, workers, tokens) = (32, 4, 40);

    // Healthy: every record stored.
    let up = traffic(&[proxy], n, workers, tokens).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while stored(api).await < n {
        assert!(Instant::now() < deadline, "{}", stack.tw.log_tail(30));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The store fails: every write waits out the busy timeout (5 s) and fails. The streams
    // meanwhile: all complete, as fast as before.
    let db = stack.data_dir().join("tokenwatch.db");
    let locker = Locker::lock(&db);
    let locked_at = Instant::now();
    let mut failing: Vec<Seen> = Vec::new();
    // Streams until the store has visibly failed (a write error counted), at least 8 s.
    let (ready_status, ready_body, ready_took) = loop {
        failing.extend(traffic(&[proxy], n, workers, tokens).await);
        let m = metrics(api).await;
        if value(&m, "tokenwatch_store_write_errors_total") >= 1.0
            && locked_at.elapsed() > Duration::from_secs(8)
        {
            let started = Instant::now();
            let r = get(&format!("http://{api}/readyz")).await;
            break (r.status, r.body, started.elapsed());
        }
        assert!(
            locked_at.elapsed() < Duration::from_secs(60),
            "no store write failed while the database was locked:\n{m}\n{}",
            stack.tw.log_tail(30)
        );
    };
    let report = assert_fails_open(&up, &failing, "store failing");
    assert!(
        ready_took < Duration::from_secs(1),
        "/readyz took {ready_took:?} with the store failing"
    );
    assert!(
        ready_body.contains("\"store\":\"error"),
        "/readyz does not name the store's failure: {ready_status} {ready_body}"
    );
    // The proxy forwards every request meanwhile: it stays in a load balancer's rotation.
    assert_eq!(ready_status, 200, "{ready_body}");
    let failing_for = locked_at.elapsed();
    locker.release();

    // Recovered: the store takes writes again, and every record of every phase is either
    // stored or counted as lost — none vanishes without a count.
    let after = traffic(&[proxy], n, workers, tokens).await;
    let total = up.len() + failing.len() + after.len();
    let deadline = Instant::now() + Duration::from_secs(30);
    let (kept, dropped) = loop {
        let m = metrics(api).await;
        let (kept, dropped) = (stored(api).await, lost(&m));
        if kept + dropped as usize == total && kept >= 2 * n {
            break (kept, dropped);
        }
        assert!(
            Instant::now() < deadline,
            "{kept} stored + {dropped} counted lost for {total} streams\n{m}\n{}",
            stack.tw.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(dropped >= 1.0, "no record was lost while the store failed");
    let r = get(&format!("http://{api}/readyz")).await;
    assert_eq!(
        r.status, 200,
        "ready again once the store works: {}",
        r.body
    );
    println!(
        "{report}\n{} streams while the store failed ({:.1} s), all complete; {total} streams in all: {kept} records stored, {dropped} counted lost; /readyz while failing: {ready_status} in {ready_took:?}",
        failing.len(),
        failing_for.as_secs_f64(),
    );
    let mut stack = stack;
    assert!(stack.tw.terminate().success());
}
