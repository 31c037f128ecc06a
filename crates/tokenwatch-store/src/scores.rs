// Feedback and evaluation scores posted for requests (`POST /api/v1/feedback`, `/api/v1/scores`,
// span attributes): rows keyed by request id and/or trace id beside the records, retained like them.

use rusqlite::{Connection, TransactionBehavior, params};
use serde::Serialize;

/// One piece of feedback, evaluation score or verdict on one request.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ScoreRow {
    /// The request scored; empty when it is known by its trace id only.
    pub request_id: String,
    /// The request's W3C trace id; empty when it is known by its request id only.
    pub trace_id: String,
    /// When the score was given.
    pub at_unix_ms: i64,
    /// `thumbs`, `guardrail`, `hallucination`, `retrieval_recall`, `retrieval_empty`, or an
    /// evaluation score's name (`bleu`, `toxicity`, `factuality`, ...).
    pub name: String,
    /// Thumbs: 1 up, 0 down; verdicts and flags: 1 flagged, 0 not; scores: their value.
    pub value: f64,
    /// Where it came from: `feedback`, `scores` or `span`.
    pub source: String,
}

pub(crate) const RETENTION: &str = "DELETE FROM scores WHERE id IN \
    (SELECT id FROM scores WHERE at_unix_ms < ?1 LIMIT ?2)";

/// All rows in one transaction.
pub(crate) fn insert(conn: &mut Connection, rows: &[ScoreRow]) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut st = tx.prepare_cached(
            "INSERT INTO scores (request_id, trace_id, at_unix_ms, name, value, source) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?;
        for r in rows {
            let value = if r.value.is_finite() { r.value } else { 0.0 };
            st.execute(params![
                r.request_id,
                r.trace_id,
                r.at_unix_ms,
                r.name,
                value,
                r.source
            ])?;
        }
    }
    tx.commit()
}

/// The scores given to any of these request ids or trace ids (empty ids match nothing), oldest
/// first. Ids are looked up in chunks (SQLite's parameter limit).
pub(crate) fn query(
    conn: &Connection,
    request_ids: &[String],
    trace_ids: &[String],
) -> rusqlite::Result<Vec<ScoreRow>> {
    let mut out: Vec<(i64, ScoreRow)> = Vec::new();
    for (column, ids) in [("request_id", request_ids), ("trace_id", trace_ids)] {
        let ids: Vec<&String> = ids.iter().filter(|s| !s.is_empty()).collect();
        for chunk in ids.chunks(500) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let sql = format!(
                "SELECT id, request_id, trace_id, at_unix_ms, name, value, source FROM scores \
                 WHERE {column} IN ({marks})"
            );
            let mut st = conn.prepare_cached(&sql)?;
            let rows = st.query_map(rusqlite::params_from_iter(chunk.iter()), |r| {
                Ok((
                    r.get(0)?,
                    ScoreRow {
                        request_id: r.get(1)?,
                        trace_id: r.get(2)?,
                        at_unix_ms: r.get(3)?,
                        name: r.get(4)?,
                        value: r.get(5)?,
                        source: r.get(6)?,
                    },
                ))
            })?;
            for row in rows {
                out.push(row?);
            }
        }
    }
    // A row matching by both its request id and its trace id is read twice.
    out.sort_by_key(|(id, r)| (r.at_unix_ms, *id));
    out.dedup_by_key(|(id, _)| *id);
    Ok(out.into_iter().map(|(_, r)| r).collect())
}
