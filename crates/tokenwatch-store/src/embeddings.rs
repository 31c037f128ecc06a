// Output embeddings posted after the fact (`POST /api/v1/embeddings`): rows kept beside the
// records, merged into a record without its own embedding when read, retained like raw records.

use crate::codec::encode_embedding;
use rusqlite::{Connection, TransactionBehavior, params};

/// One posted embedding: for the request `request_id` of `model_id`, at `at_unix_ms`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EmbeddingRow {
    pub request_id: String,
    pub model_id: String,
    pub at_unix_ms: i64,
    pub embedding: Vec<f32>,
}

pub(crate) const RETENTION: &str = "DELETE FROM embeddings WHERE id IN \
    (SELECT id FROM embeddings WHERE at_unix_ms < ?1 LIMIT ?2)";

/// All rows in one transaction.
pub(crate) fn insert(conn: &mut Connection, rows: &[EmbeddingRow]) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut st = tx.prepare_cached(
            "INSERT INTO embeddings (request_id, model_id, at_unix_ms, embedding) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for r in rows {
            st.execute(params![
                r.request_id,
                r.model_id,
                r.at_unix_ms,
                encode_embedding(&r.embedding)
            ])?;
        }
    }
    tx.commit()
}
