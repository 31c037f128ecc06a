// Version and deploy markers (spec section 8): when a model's or prompt's version changed, or an
// operator marked a deploy; the row type, its query and the SQLite statements.

use rusqlite::{Connection, TransactionBehavior, params};
use serde::{Deserialize, Serialize};

/// One marker on the time axis. `kind` is `model_version`, `prompt_version`, `deploy` or
/// `custom`; `source` is `proxy`, `otlp`, `scrape` or `api` (the store keeps what it is given).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct MarkerRow {
    /// Unique; inserting an id already stored leaves the stored marker as is.
    pub id: String,
    pub kind: String,
    /// The model it concerns; empty for a marker of the whole fleet.
    pub model: String,
    /// The version before (empty when not known or not a version change).
    pub from_version: String,
    pub to_version: String,
    pub source: String,
    pub at_unix_ms: i64,
    pub note: String,
}

/// Filters for [`crate::Store::query_markers`]; all given filters must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkerQuery {
    /// Exact id.
    pub id: Option<String>,
    /// Exact model.
    pub model: Option<String>,
    /// Only markers with `at_unix_ms >= since_unix_ms`.
    pub since_unix_ms: Option<i64>,
    /// Maximum number of rows returned (the newest ones; 0 returns none).
    pub limit: usize,
}

impl Default for MarkerQuery {
    /// No filter, the 1000 newest markers.
    fn default() -> Self {
        MarkerQuery {
            id: None,
            model: None,
            since_unix_ms: None,
            limit: 1000,
        }
    }
}

/// Markers are kept as long as the roll-ups they are compared on.
pub(crate) const RETENTION: &str = "DELETE FROM markers WHERE id IN \
    (SELECT id FROM markers WHERE at_unix_ms < ?1 LIMIT ?2)";

/// All rows in one transaction; an id already stored is skipped.
pub(crate) fn insert(conn: &mut Connection, rows: &[MarkerRow]) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut st = tx.prepare_cached(
            "INSERT OR IGNORE INTO markers (id, kind, model, from_version, to_version, source, \
             at_unix_ms, note) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        for r in rows {
            st.execute(params![
                r.id,
                r.kind,
                r.model,
                r.from_version,
                r.to_version,
                r.source,
                r.at_unix_ms,
                r.note
            ])?;
        }
    }
    tx.commit()
}

/// The newest `q.limit` matching markers, returned oldest first (by time, then id).
pub(crate) fn query(conn: &Connection, q: &MarkerQuery) -> rusqlite::Result<Vec<MarkerRow>> {
    if q.limit == 0 {
        return Ok(Vec::new());
    }
    let mut conds = Vec::new();
    let mut args: Vec<rusqlite::types::Value> = Vec::new();
    if let Some(id) = &q.id {
        conds.push("id = ?");
        args.push(id.clone().into());
    }
    if let Some(m) = &q.model {
        conds.push("model = ?");
        args.push(m.clone().into());
    }
    if let Some(since) = q.since_unix_ms {
        conds.push("at_unix_ms >= ?");
        args.push(since.into());
    }
    args.push(i64::try_from(q.limit).unwrap_or(i64::MAX).into());
    let filter = if conds.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conds.join(" AND "))
    };
    let sql = format!(
        "SELECT id, kind, model, from_version, to_version, source, at_unix_ms, note FROM markers\
         {filter} ORDER BY at_unix_ms DESC, id DESC LIMIT ?"
    );
    let mut st = conn.prepare_cached(&sql)?;
    let rows = st.query_map(rusqlite::params_from_iter(args), |r| {
        Ok(MarkerRow {
            id: r.get(0)?,
            kind: r.get(1)?,
            model: r.get(2)?,
            from_version: r.get(3)?,
            to_version: r.get(4)?,
            source: r.get(5)?,
            at_unix_ms: r.get(6)?,
            note: r.get(7)?,
        })
    })?;
    let mut out = rows.collect::<rusqlite::Result<Vec<_>>>()?;
    out.reverse();
    Ok(out)
}
