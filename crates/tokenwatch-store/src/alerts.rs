// Alerts kept across restarts: one row per alert id (its fingerprint, state and times as columns,
// the whole alert as JSON), upserted on every state change; resolved ones retained like raw records.

use rusqlite::{Connection, TransactionBehavior, params};
use tokenwatch_core::alert::{Alert, AlertState};

pub(crate) const RETENTION: &str = "DELETE FROM alerts WHERE id IN \
    (SELECT id FROM alerts WHERE resolved_at_unix_ms IS NOT NULL AND resolved_at_unix_ms < ?1 \
     LIMIT ?2)";

/// The latest time the alert changed at: its resolution, firing, activation or latest event.
fn updated_at(a: &Alert) -> i64 {
    [
        Some(a.active_at_unix_ms),
        a.fired_at_unix_ms,
        a.resolved_at_unix_ms,
        a.last_event.as_ref().map(|e| e.at_unix_ms),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(a.active_at_unix_ms)
}

/// Insert or replace every alert (by id) in one transaction.
pub(crate) fn upsert(conn: &mut Connection, alerts: &[Alert]) -> Result<(), UpsertError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut st = tx.prepare_cached(
            "INSERT INTO alerts (id, fingerprint, state, active_at_unix_ms, updated_unix_ms, \
             resolved_at_unix_ms, alert) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
             ON CONFLICT (id) DO UPDATE SET fingerprint = excluded.fingerprint, \
             state = excluded.state, active_at_unix_ms = excluded.active_at_unix_ms, \
             updated_unix_ms = excluded.updated_unix_ms, \
             resolved_at_unix_ms = excluded.resolved_at_unix_ms, alert = excluded.alert",
        )?;
        for a in alerts {
            let json = serde_json::to_string(a).map_err(|e| UpsertError::Json(a.id.clone(), e))?;
            // A resolved alert always has a resolution time, so retention can find it.
            let resolved_at = match a.state {
                AlertState::Resolved => {
                    Some(a.resolved_at_unix_ms.unwrap_or_else(|| updated_at(a)))
                }
                _ => None,
            };
            st.execute(params![
                a.id,
                a.fingerprint,
                a.state.name(),
                a.active_at_unix_ms,
                updated_at(a),
                resolved_at,
                json,
            ])?;
        }
    }
    tx.commit()?;
    Ok(())
}

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

/// Delete alerts by id (a pending alert whose condition went away is forgotten).
pub(crate) fn delete(conn: &mut Connection, ids: &[String]) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut st = tx.prepare_cached("DELETE FROM alerts WHERE id = ?1")?;
        for id in ids {
            st.execute([id])?;
        }
    }
    tx.commit()
}

/// Every active (pending, firing) alert and the resolved ones resolved at or after
/// `resolved_since_unix_ms`; newest first (by resolution, else activation). A row whose JSON does
/// not decode is skipped with a warning.
pub(crate) fn load(conn: &Connection, resolved_since_unix_ms: i64) -> rusqlite::Result<Vec<Alert>> {
    let mut st = conn.prepare_cached(
        "SELECT id, alert FROM alerts WHERE resolved_at_unix_ms IS NULL OR resolved_at_unix_ms >= ?1 \
         ORDER BY COALESCE(resolved_at_unix_ms, active_at_unix_ms) DESC, id",
    )?;
    let rows = st.query_map([resolved_since_unix_ms], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (id, json) = row?;
        match serde_json::from_str::<Alert>(&json) {
            Ok(a) => out.push(a),
            Err(e) => {
                tracing::warn!(alert = %id, error = %e, "stored alert does not decode; skipped")
            }
        }
    }
    Ok(out)
}
