// Feedback and evaluation scores on ClickHouse: one row per score in a day-partitioned table,
// read back by request id or trace id (retention drops whole days with the raw tier).

use crate::clickhouse::client::{Client, Params};
use crate::clickhouse::rowbinary::{Reader, Writer};
use crate::clickhouse::schema::SCORES;
use crate::{ScoreRow, StoreError};

pub(crate) const COLUMNS: &str = "request_id, trace_id, at_unix_ms, name, value, source, seq";

/// Ids per `IN {pN:Array(String)}` parameter, well under the server's 1 MiB URL limit.
const IN_CHUNK: usize = 1000;

/// RowBinary rows, `seq` onwards; a non-finite value is stored as 0, as the SQLite store does.
pub(crate) fn rows(list: &[ScoreRow], seq: u64) -> Vec<u8> {
    let mut w = Writer::default();
    for (i, r) in list.iter().enumerate() {
        w.str(&r.request_id);
        w.str(&r.trace_id);
        w.i64(r.at_unix_ms);
        w.str(&r.name);
        w.f64(if r.value.is_finite() { r.value } else { 0.0 });
        w.str(&r.source);
        w.u64(seq + i as u64);
    }
    w.buf
}

/// The scores of any of these request ids or trace ids, oldest first (by time, then `seq`),
/// each row once.
pub(crate) fn query(
    client: &Client,
    request_ids: &[String],
    trace_ids: &[String],
) -> Result<Vec<ScoreRow>, StoreError> {
    let mut out: Vec<(u64, ScoreRow)> = Vec::new();
    for (column, ids) in [("request_id", request_ids), ("trace_id", trace_ids)] {
        let ids: Vec<&str> = ids
            .iter()
            .map(String::as_str)
            .filter(|s| !s.is_empty())
            .collect();
        for chunk in ids.chunks(IN_CHUNK) {
            let mut p = Params::default();
            let sql = format!(
                "SELECT {COLUMNS} FROM {db}.{SCORES} WHERE {column} IN {list} FORMAT RowBinary",
                db = client.database(),
                list = p.strs(chunk.iter().copied())
            );
            let body = client.query_with("query_scores", &sql, &p, true)?;
            let mut r = Reader::new(&body);
            while !r.is_empty() {
                let row = decode(&mut r).map_err(|detail| StoreError::CorruptRow {
                    database: client.label().to_string(),
                    table: SCORES,
                    row: format!("row {} of the answer", out.len()),
                    detail,
                })?;
                out.push(row);
            }
        }
    }
    // A row matching by both its request id and its trace id is read twice.
    out.sort_by_key(|(seq, r)| (r.at_unix_ms, *seq));
    out.dedup();
    Ok(out.into_iter().map(|(_, r)| r).collect())
}

fn decode(r: &mut Reader<'_>) -> Result<(u64, ScoreRow), String> {
    let row = ScoreRow {
        request_id: r.string()?,
        trace_id: r.string()?,
        at_unix_ms: r.i64()?,
        name: r.string()?,
        value: r.f64()?,
        source: r.string()?,
    };
    Ok((r.u64()?, row))
}
