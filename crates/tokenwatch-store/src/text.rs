// Captured prompt and completion text (already masked by the pipeline): rows keyed by request id
// beside the records, attached to records when read, deleted per region (`retention.regions`).

use rusqlite::{Connection, Transaction, params};
use std::collections::{BTreeMap, HashMap};
use tokenwatch_core::model::{CapturedText, RequestRecord};

/// Region of text whose region has no retention of its own.
pub const DEFAULT_REGION: &str = "default";

/// Every captured text of `records` inside the caller's transaction (the records' own).
pub(crate) fn insert(tx: &Transaction<'_>, records: &[RequestRecord]) -> rusqlite::Result<()> {
    let mut st = tx.prepare_cached(
        "INSERT INTO record_text (request_id, arrival_unix_ms, region, prompt, completion, masked, \
         truncated) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    for r in records {
        if let Some(t) = &r.text {
            let masked = serde_json::to_string(&t.masked).unwrap_or_else(|_| "{}".into());
            st.execute(params![
                r.request_id,
                r.arrival_unix_ms,
                t.region,
                t.prompt,
                t.completion,
                masked,
                t.truncated
            ])?;
        }
    }
    Ok(())
}

/// Attaches stored text to the records that have some (matched by request id and arrival).
pub(crate) fn attach(conn: &Connection, records: &mut [RequestRecord]) -> rusqlite::Result<()> {
    let ids: Vec<&str> = records.iter().map(|r| r.request_id.as_str()).collect();
    let mut found: HashMap<(String, i64), CapturedText> = HashMap::new();
    for chunk in ids.chunks(500) {
        let marks = vec!["?"; chunk.len()].join(", ");
        let sql = format!(
            "SELECT request_id, arrival_unix_ms, region, prompt, completion, masked, truncated \
             FROM record_text WHERE request_id IN ({marks})"
        );
        let mut st = conn.prepare_cached(&sql)?;
        let rows = st.query_map(rusqlite::params_from_iter(chunk.iter()), |r| {
            let masked: String = r.get(5)?;
            let text = CapturedText {
                region: r.get(2)?,
                prompt: r.get(3)?,
                completion: r.get(4)?,
                masked: serde_json::from_str::<BTreeMap<String, u32>>(&masked).unwrap_or_default(),
                truncated: r.get(6)?,
            };
            Ok(((r.get::<_, String>(0)?, r.get::<_, i64>(1)?), text))
        })?;
        for row in rows {
            let (key, text) = row?;
            found.insert(key, text);
        }
    }
    for r in records.iter_mut() {
        if let Some(t) = found.remove(&(r.request_id.clone(), r.arrival_unix_ms)) {
            r.text = Some(Box::new(t));
        }
    }
    Ok(())
}

/// Deletes text older than its region's retention (regions not listed use `default`), and any
/// text older than `raw_cutoff` (text never outlives its record). Returns rows deleted.
pub(crate) fn apply_retention(
    conn: &Connection,
    now_unix_ms: i64,
    raw_cutoff: i64,
    regions: &BTreeMap<String, std::time::Duration>,
) -> rusqlite::Result<u64> {
    let cutoff = |keep: &std::time::Duration| {
        now_unix_ms
            .saturating_sub(i64::try_from(keep.as_millis()).unwrap_or(i64::MAX))
            .max(raw_cutoff)
    };
    let mut deleted = 0u64;
    let mut listed = Vec::new();
    for (region, keep) in regions.iter().filter(|(r, _)| r.as_str() != DEFAULT_REGION) {
        deleted += conn.execute(
            "DELETE FROM record_text WHERE region = ?1 AND arrival_unix_ms < ?2",
            params![region, cutoff(keep)],
        )? as u64;
        listed.push(region.clone());
    }
    let default_cutoff = regions
        .get(DEFAULT_REGION)
        .map(cutoff)
        .unwrap_or(raw_cutoff);
    let marks = std::iter::repeat_n("?", listed.len())
        .collect::<Vec<_>>()
        .join(", ");
    let sql = if listed.is_empty() {
        "DELETE FROM record_text WHERE arrival_unix_ms < ?".to_string()
    } else {
        format!("DELETE FROM record_text WHERE arrival_unix_ms < ? AND region NOT IN ({marks})")
    };
    let mut values: Vec<rusqlite::types::Value> = vec![default_cutoff.into()];
    values.extend(listed.into_iter().map(rusqlite::types::Value::from));
    deleted += conn.execute(&sql, rusqlite::params_from_iter(values))? as u64;
    Ok(deleted)
}
