// Scrape targets as the collectors see them, kept so that sharded collectors sharing a store each
// list every target: the row type and its SQLite statements (one row per URL, the latest wins).

use rusqlite::{Connection, TransactionBehavior, params};
use serde::{Deserialize, Serialize};

/// One scrape target's status as published by the collector (shard) that scrapes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrapeTargetRow {
    /// The scrape URL (the key).
    pub url: String,
    pub instance: String,
    pub runtime: String,
    /// `up`, `down` or `unknown` (not scraped yet).
    pub health: String,
    pub last_error: Option<String>,
    pub last_scrape_unix_ms: Option<i64>,
    /// The shard that scrapes it, of `shard_count` (0 of 1 without sharding).
    pub shard_index: u64,
    pub shard_count: u64,
    /// When the collector published this row.
    pub updated_unix_ms: i64,
}

pub(crate) const RETENTION: &str = "DELETE FROM scrape_targets WHERE url IN \
    (SELECT url FROM scrape_targets WHERE updated_unix_ms < ?1 LIMIT ?2)";

#[derive(Debug)]
pub(crate) enum UpsertError {
    Sqlite(rusqlite::Error),
    Json(String, serde_json::Error),
}

impl From<rusqlite::Error> for UpsertError {
    fn from(e: rusqlite::Error) -> Self {
        UpsertError::Sqlite(e)
    }
}

/// Insert or replace every row (by URL) in one transaction; an older row never replaces a newer.
pub(crate) fn upsert(conn: &mut Connection, rows: &[ScrapeTargetRow]) -> Result<(), UpsertError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut st = tx.prepare_cached(
            "INSERT INTO scrape_targets (url, updated_unix_ms, target) VALUES (?1, ?2, ?3) \
             ON CONFLICT (url) DO UPDATE SET updated_unix_ms = excluded.updated_unix_ms, \
             target = excluded.target WHERE excluded.updated_unix_ms >= updated_unix_ms",
        )?;
        for r in rows {
            let json = serde_json::to_string(r).map_err(|e| UpsertError::Json(r.url.clone(), e))?;
            st.execute(params![r.url, r.updated_unix_ms, json])?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// Rows updated at or after `since`, by URL. A row whose JSON does not decode is skipped with
/// a warning.
pub(crate) fn load(conn: &Connection, since: i64) -> rusqlite::Result<Vec<ScrapeTargetRow>> {
    let mut st = conn.prepare_cached(
        "SELECT url, target FROM scrape_targets WHERE updated_unix_ms >= ?1 ORDER BY url",
    )?;
    let rows = st.query_map([since], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (url, json) = row?;
        match serde_json::from_str(&json) {
            Ok(t) => out.push(t),
            Err(e) => {
                tracing::warn!(target_url = %url, error = %e, "stored scrape target does not decode; skipped")
            }
        }
    }
    Ok(out)
}
