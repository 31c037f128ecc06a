// Per-request anomaly annotations written by the alert engine (e.g. an output length outlier with
// its joint grade): rows keyed by request id beside the records, retained like raw records.

use rusqlite::{Connection, TransactionBehavior, params};
use serde::Serialize;

/// One detector's verdict on one request.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct AnnotationRow {
    pub request_id: String,
    pub model_id: String,
    pub instance: String,
    /// When the engine annotated the request (the record's end).
    pub at_unix_ms: i64,
    /// Detector name, e.g. `output_length_outlier`.
    pub detector: String,
    /// 1.0 at the detector's threshold, growing with severity.
    pub score: f64,
    /// Spec 4's joint grade of the request's anomalies: `high`, `medium` or `normal`.
    pub joint_grade: String,
    /// The measured value (e.g. output tokens).
    pub value: f64,
    pub summary: String,
    /// The detector's evidence (reference median, σ, deviation…) as a JSON object.
    pub evidence: serde_json::Value,
}

pub(crate) const RETENTION: &str = "DELETE FROM annotations WHERE id IN \
    (SELECT id FROM annotations WHERE at_unix_ms < ?1 LIMIT ?2)";

/// All rows in one transaction.
pub(crate) fn insert(conn: &mut Connection, rows: &[AnnotationRow]) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut st = tx.prepare_cached(
            "INSERT INTO annotations (request_id, model_id, instance, at_unix_ms, detector, score, \
             joint_grade, value, summary, evidence) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        )?;
        for r in rows {
            st.execute(params![
                r.request_id,
                r.model_id,
                r.instance,
                r.at_unix_ms,
                r.detector,
                finite(r.score),
                r.joint_grade,
                finite(r.value),
                r.summary,
                r.evidence.to_string(),
            ])?;
        }
    }
    tx.commit()
}

/// SQLite stores NaN as NULL; keep the columns NOT NULL with 0 instead.
fn finite(v: f64) -> f64 {
    if v.is_finite() { v } else { 0.0 }
}

/// Annotations of the given requests, oldest first. Ids are looked up in chunks (SQLite's
/// parameter limit); a row whose evidence is not valid JSON comes back with `null` evidence.
pub(crate) fn query(
    conn: &Connection,
    request_ids: &[String],
) -> rusqlite::Result<Vec<AnnotationRow>> {
    let mut out = Vec::new();
    for chunk in request_ids.chunks(500) {
        let marks = vec!["?"; chunk.len()].join(", ");
        let sql = format!(
            "SELECT request_id, model_id, instance, at_unix_ms, detector, score, joint_grade, value, \
             summary, evidence FROM annotations WHERE request_id IN ({marks}) ORDER BY at_unix_ms, id"
        );
        let mut st = conn.prepare_cached(&sql)?;
        let rows = st.query_map(rusqlite::params_from_iter(chunk.iter()), |r| {
            let evidence: String = r.get(9)?;
            Ok(AnnotationRow {
                request_id: r.get(0)?,
                model_id: r.get(1)?,
                instance: r.get(2)?,
                at_unix_ms: r.get(3)?,
                detector: r.get(4)?,
                score: r.get(5)?,
                joint_grade: r.get(6)?,
                value: r.get(7)?,
                summary: r.get(8)?,
                evidence: serde_json::from_str(&evidence).unwrap_or(serde_json::Value::Null),
            })
        })?;
        for row in rows {
            out.push(row?);
        }
    }
    out.sort_by_key(|r| r.at_unix_ms);
    Ok(out)
}
