// Scrape targets on ClickHouse: one row per publication (url, time, the row as JSON) in a
// day-partitioned replacing table; the newest row of each URL is the target.

use crate::clickhouse::client::{Client, Params};
use crate::clickhouse::rowbinary::{Reader, Writer};
use crate::clickhouse::schema::SCRAPE_TARGETS;
use crate::{ScrapeTargetRow, StoreError};

pub(crate) const COLUMNS: &str = "url, updated_unix_ms, target, seq";

/// RowBinary rows; Err names the target whose JSON could not be written.
pub(crate) fn rows(list: &[ScrapeTargetRow], seq: u64) -> Result<Vec<u8>, (String, String)> {
    let mut w = Writer::default();
    for (i, r) in list.iter().enumerate() {
        let json = serde_json::to_string(r).map_err(|e| (r.url.clone(), e.to_string()))?;
        w.str(&r.url);
        w.i64(r.updated_unix_ms);
        w.str(&json);
        w.u64(seq + i as u64);
    }
    Ok(w.buf)
}

/// The newest row of every URL updated at or after `since`, by URL.
pub(crate) fn load(client: &Client, since: i64) -> Result<Vec<ScrapeTargetRow>, StoreError> {
    let mut p = Params::default();
    let sql = format!(
        "SELECT url, target FROM (SELECT url, target, updated_unix_ms FROM {}.{SCRAPE_TARGETS} \
         WHERE updated_unix_ms >= {} ORDER BY url, updated_unix_ms DESC, seq DESC \
         LIMIT 1 BY url) ORDER BY url FORMAT RowBinary",
        client.database(),
        p.ms(since)
    );
    let body = client.query_with("load_scrape_targets", &sql, &p, true)?;
    let mut r = Reader::new(&body);
    let mut out = Vec::new();
    let mut n = 0usize;
    while !r.is_empty() {
        let row = r
            .string()
            .and_then(|url| Ok((url, r.string()?)))
            .map_err(|detail| StoreError::CorruptRow {
                database: client.label().to_string(),
                table: SCRAPE_TARGETS,
                row: format!("row {n} of the answer"),
                detail,
            })?;
        n += 1;
        match serde_json::from_str(&row.1) {
            Ok(t) => out.push(t),
            Err(e) => {
                tracing::warn!(target_url = %row.0, error = %e, "stored scrape target does not decode; skipped")
            }
        }
    }
    Ok(out)
}
