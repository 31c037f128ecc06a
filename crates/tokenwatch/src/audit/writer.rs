// The audit log's writer thread: appends each record to the day's `audit-YYYY-MM-DD.jsonl`,
// flushes every second and on close, and deletes day files older than the retention.

use super::entry::Record;
use super::refusals::{Refusals, is_refusal};
use chrono::{NaiveDate, Utc};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// Longest time a written record stays in the buffer.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// How often old files are looked for after the start.
const PRUNE_INTERVAL: Duration = Duration::from_secs(86_400);

/// What the request path sends to the writer.
pub enum Msg {
    Record(Box<Record>),
    /// Write what is queued, flush and stop.
    Close,
}

/// The file name of `day`'s records.
pub fn file_name(day: NaiveDate) -> String {
    format!("audit-{}.jsonl", day.format("%Y-%m-%d"))
}

/// The day of an `audit-YYYY-MM-DD.jsonl` name; `None` for any other file.
fn day_of(name: &str) -> Option<NaiveDate> {
    let date = name.strip_prefix("audit-")?.strip_suffix(".jsonl")?;
    NaiveDate::parse_from_str(date, "%Y-%m-%d").ok()
}

/// Delete the day files in `dir` dated more than `retention` before `today`; returns how many.
pub fn prune(dir: &Path, retention: Duration, today: NaiveDate) -> std::io::Result<usize> {
    let keep_days = i64::try_from(retention.as_secs() / 86_400).unwrap_or(i64::MAX);
    let Some(oldest_kept) =
        today.checked_sub_signed(chrono::Duration::days(keep_days.min(1 << 20)))
    else {
        return Ok(0);
    };
    let mut deleted = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(day) = name.to_str().and_then(day_of) else {
            continue;
        };
        if day < oldest_kept {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => deleted += 1,
                Err(e) => {
                    tracing::warn!(file = %entry.path().display(), error = %e, "audit: cannot delete an expired audit file")
                }
            }
        }
    }
    Ok(deleted)
}

/// Create the audit directory (owner-only on Unix: the lines say who asked for what).
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
}

fn open_day(dir: &Path, day: NaiveDate) -> std::io::Result<BufWriter<File>> {
    let mut o = OpenOptions::new();
    o.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    Ok(BufWriter::with_capacity(
        64 * 1024,
        o.open(dir.join(file_name(day)))?,
    ))
}

/// The writer's state: the open day file, and whether the last write failed (logged once).
pub struct Writer {
    dir: PathBuf,
    retention: Duration,
    current: Option<(NaiveDate, BufWriter<File>)>,
    failing: bool,
    /// Refused attempts of the current window (`super::refusals`).
    refusals: Refusals,
}

impl Writer {
    pub fn new(dir: PathBuf, retention: Duration) -> Writer {
        Writer {
            dir,
            retention,
            current: None,
            failing: false,
            refusals: Refusals::default(),
        }
    }

    fn report(&mut self, result: std::io::Result<()>) {
        match result {
            Ok(()) => {
                if self.failing {
                    tracing::info!(dir = %self.dir.display(), "audit: writing works again");
                }
                self.failing = false;
            }
            Err(e) => {
                if !self.failing {
                    tracing::error!(dir = %self.dir.display(), error = %e, "audit: cannot write the audit log; records are lost until it works again");
                }
                self.failing = true;
                // Reopen on the next record.
                self.current = None;
            }
        }
    }

    fn write(&mut self, record: &Record) {
        let day = record.day();
        let result = (|| {
            if self.current.as_ref().map(|(d, _)| *d) != Some(day) {
                if let Some((_, mut old)) = self.current.take() {
                    old.flush()?;
                }
                self.current = Some((day, open_day(&self.dir, day)?));
            }
            let (_, w) = self.current.as_mut().expect("opened above");
            let mut line = record.to_line();
            line.push('\n');
            w.write_all(line.as_bytes())
        })();
        self.report(result);
    }

    /// Write `record`, unless it is a refusal folded into its window's summary.
    fn take_record(&mut self, record: &Record) {
        if let Record::Request(r) = record
            && is_refusal(r)
            && !self.refusals.admit(r)
        {
            return;
        }
        self.write(record);
    }

    /// Write the refusals' summaries when their window is over (`all`: whatever is counted).
    fn write_refusals(&mut self, all: bool) -> bool {
        if !all && !self.refusals.due(Instant::now()) {
            return false;
        }
        let summaries = self.refusals.take(Utc::now());
        let any = !summaries.is_empty();
        for s in summaries {
            self.write(&Record::Refused(s));
        }
        any
    }

    pub fn flush(&mut self) {
        if let Some((_, w)) = self.current.as_mut() {
            let result = w.flush();
            self.report(result);
        }
    }

    fn prune(&self) {
        match prune(&self.dir, self.retention, Utc::now().date_naive()) {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "audit: expired audit files deleted"),
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "audit: cannot look for expired audit files")
            }
        }
    }

    /// Write records until `Close` or until every sender is gone; flush at least every
    /// `FLUSH_INTERVAL` and prune once a day.
    pub fn run(mut self, rx: Receiver<Msg>) {
        let mut last_flush = Instant::now();
        let mut last_prune = Instant::now();
        let mut dirty = false;
        loop {
            let wait = FLUSH_INTERVAL.saturating_sub(last_flush.elapsed());
            match rx.recv_timeout(if dirty { wait } else { FLUSH_INTERVAL }) {
                Ok(Msg::Record(r)) => {
                    self.take_record(&r);
                    dirty = true;
                }
                Ok(Msg::Close) => {
                    while let Ok(Msg::Record(r)) = rx.try_recv() {
                        self.take_record(&r);
                    }
                    break;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            dirty |= self.write_refusals(false);
            if dirty && last_flush.elapsed() >= FLUSH_INTERVAL {
                self.flush();
                dirty = false;
                last_flush = Instant::now();
            }
            if last_prune.elapsed() >= PRUNE_INTERVAL {
                self.prune();
                last_prune = Instant::now();
            }
        }
        self.write_refusals(true);
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::entry::AuditEvent;

    #[test]
    fn a_burst_of_refusals_is_one_line_and_a_count_and_other_requests_stay_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = std::sync::mpsc::sync_channel(8192);
        let w = Writer::new(dir.path().to_path_buf(), Duration::from_secs(86_400));
        let t = std::thread::spawn(move || w.run(rx));
        let entry = |status: u16, caller: &str| crate::audit::RequestEntry {
            ts: Utc::now(),
            caller: caller.into(),
            role: None,
            remote: Some("127.0.0.1:4000".parse().unwrap()),
            method: "GET".into(),
            path: "/metrics".into(),
            query: None,
            status,
            bytes: 10,
            duration_ms: 0.1,
        };
        for _ in 0..5000 {
            let r = Record::Request(entry(401, "anonymous"));
            tx.send(Msg::Record(Box::new(r))).unwrap();
        }
        for _ in 0..3 {
            let r = Record::Request(entry(200, "grafana"));
            tx.send(Msg::Record(Box::new(r))).unwrap();
        }
        tx.send(Msg::Close).unwrap();
        t.join().unwrap();
        let text =
            std::fs::read_to_string(dir.path().join(file_name(Utc::now().date_naive()))).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 5, "{text}");
        let refused: Vec<_> = lines.iter().filter(|l| l["status"] == 401).collect();
        assert_eq!(refused.len(), 2, "{text}");
        assert_eq!(refused[0]["path"], "/metrics", "the first is written whole");
        let summary = refused[1];
        assert_eq!(summary["event"], "requests_refused");
        assert_eq!(summary["count"], 4999);
        assert_eq!(summary["remote"], "127.0.0.1");
        assert_eq!(summary["caller"], "anonymous");
        assert_eq!(
            (&summary["method"], &summary["path"]),
            (&"GET".into(), &"/metrics".into())
        );
        assert!(summary["first"].is_string() && summary["last"].is_string());
        assert_eq!(lines.iter().filter(|l| l["caller"] == "grafana").count(), 3);
    }

    #[test]
    fn prune_deletes_only_expired_day_files() {
        let dir = tempfile::tempdir().unwrap();
        let today = NaiveDate::from_ymd_opt(2026, 5, 31).unwrap();
        let day = |n: i64| today - chrono::Duration::days(n);
        for n in [0, 29, 30, 31, 40] {
            std::fs::write(dir.path().join(file_name(day(n))), "{}\n").unwrap();
        }
        std::fs::write(dir.path().join("audit-notes.jsonl"), "").unwrap();
        std::fs::write(dir.path().join("other-2020-01-01.jsonl"), "").unwrap();
        let deleted = prune(dir.path(), Duration::from_secs(30 * 86_400), today).unwrap();
        assert_eq!(deleted, 2);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "audit-2026-05-01.jsonl",
                "audit-2026-05-02.jsonl",
                "audit-2026-05-31.jsonl",
                "audit-notes.jsonl",
                "other-2020-01-01.jsonl"
            ]
        );
    }

    #[test]
    fn writes_one_line_per_record_into_the_records_day_and_flushes_on_close() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = std::sync::mpsc::sync_channel(16);
        let w = Writer::new(dir.path().to_path_buf(), Duration::from_secs(86_400));
        let t = std::thread::spawn(move || w.run(rx));
        let ts = chrono::DateTime::parse_from_rfc3339("2026-01-02T23:59:59.999Z")
            .unwrap()
            .to_utc();
        for (i, ts) in [ts, ts, ts + chrono::Duration::milliseconds(1)]
            .into_iter()
            .enumerate()
        {
            let event = AuditEvent::TokensReloaded {
                file: "f".into(),
                tokens: i,
            };
            tx.send(Msg::Record(Box::new(Record::Event { ts, event })))
                .unwrap();
        }
        tx.send(Msg::Close).unwrap();
        t.join().unwrap();
        let read = |d| std::fs::read_to_string(dir.path().join(d)).unwrap();
        let first = read("audit-2026-01-02.jsonl");
        assert_eq!(first.lines().count(), 2, "{first}");
        assert!(first.ends_with("\"tokens\":1}\n"), "{first}");
        let second = read("audit-2026-01-03.jsonl");
        assert_eq!(second.lines().count(), 1, "{second}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("audit-2026-01-03.jsonl"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
