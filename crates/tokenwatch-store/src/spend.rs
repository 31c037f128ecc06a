// What the stored records cost (`Store::query_spend`): their `cost_usd` summed per model and
// tenant over an arrival-time range, with how many were priced; the SQLite reading here (the
// ClickHouse one is in clickhouse/query.rs).

use rusqlite::Connection;
use serde::Serialize;

/// Filters of [`crate::Store::query_spend`]: records with `since_unix_ms <= arrival_unix_ms <
/// until_unix_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpendQuery {
    pub since_unix_ms: i64,
    pub until_unix_ms: i64,
}

/// One model and tenant's spend.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpendRow {
    pub model: String,
    pub tenant: String,
    /// Sum of the records' `cost_usd` (the unpriced ones count as 0).
    pub cost_usd: f64,
    pub requests: u64,
    /// Of `requests`, those with a cost (their model was priced).
    pub priced_requests: u64,
}

pub(crate) fn query(conn: &Connection, q: &SpendQuery) -> rusqlite::Result<Vec<SpendRow>> {
    let mut stmt = conn.prepare_cached(
        "SELECT model_id, tenant, TOTAL(cost_usd), COUNT(*), COUNT(cost_usd) FROM records \
         WHERE arrival_unix_ms >= ?1 AND arrival_unix_ms < ?2 \
         GROUP BY model_id, tenant ORDER BY model_id, tenant",
    )?;
    let rows = stmt.query_map([q.since_unix_ms, q.until_unix_ms], |r| {
        Ok(SpendRow {
            model: r.get(0)?,
            tenant: r.get(1)?,
            cost_usd: r.get(2)?,
            requests: r.get::<_, i64>(3)?.max(0) as u64,
            priced_requests: r.get::<_, i64>(4)?.max(0) as u64,
        })
    })?;
    rows.collect()
}
