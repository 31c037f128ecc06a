// Conversions between the data model and SQL rows: column lists, statement parameters,
// chunk-offset blobs (little-endian u32s) and checked decoding that names any corrupt row.

use crate::{RollupRow, StoreError};
use rusqlite::Row;
use rusqlite::types::{FromSql, Value};
use std::path::Path;
use tokenwatch_core::model::{
    ContextBucket, ErrorClass, GapSummary, LatencyMetric, RequestRecord, SeriesLabels,
};

pub(crate) const RECORD_COLUMNS: &str = "request_id, trace_id, model_id, runtime, instance, \
    tenant, ab_group, model_version, prompt_version, endpoint, stream, arrival_unix_ms, \
    upstream_headers_s, first_token_s, end_s, queue_s, chunk_offsets_us, gap_count, gap_mean_s, \
    gap_max_s, prompt_tokens, output_tokens, tokens_from_usage, finish_reason, status, error_class, \
    embedding, prefix_key, reasoning_tokens, cached_input_tokens, cost_usd";

/// `RECORD_COLUMNS` for reading: a record without its own embedding takes the latest one posted
/// for its request id (`POST /api/v1/embeddings`, table `embeddings`), whichever arrived first.
pub(crate) static RECORD_SELECT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    RECORD_COLUMNS.replace(
        "embedding, prefix_key",
        "COALESCE(records.embedding, (SELECT e.embedding FROM embeddings e \
         WHERE e.request_id = records.request_id AND e.model_id = records.model_id \
         ORDER BY e.id DESC LIMIT 1)), prefix_key",
    )
});

pub(crate) const ROLLUP_COLUMNS: &str = "model_id, runtime, instance, tenant, ab_group, \
    model_version, bucket, metric, minute_start_unix_ms, count, sketch";

pub(crate) fn encode_offsets(offsets: &[u32]) -> Vec<u8> {
    offsets.iter().flat_map(|o| o.to_le_bytes()).collect()
}

/// An embedding as a compact blob: little-endian f32s (4 bytes per dimension).
pub(crate) fn encode_embedding(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(crate) fn decode_embedding(blob: &[u8]) -> Result<Vec<f32>, String> {
    let chunks = blob.chunks_exact(4);
    if !chunks.remainder().is_empty() {
        return Err(format!(
            "embedding blob has {} bytes, not a multiple of 4",
            blob.len()
        ));
    }
    Ok(chunks
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

pub(crate) fn decode_offsets(blob: &[u8]) -> Result<Vec<u32>, String> {
    let chunks = blob.chunks_exact(4);
    if !chunks.remainder().is_empty() {
        return Err(format!(
            "chunk_offsets_us blob has {} bytes, not a multiple of 4",
            blob.len()
        ));
    }
    Ok(chunks
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn opt_u64_to_i64(v: Option<u64>, field: &str) -> Result<Option<i64>, String> {
    v.map(|n| i64::try_from(n).map_err(|_| format!("{field} = {n} exceeds i64::MAX")))
        .transpose()
}

/// The parameters of one record, in `RECORD_COLUMNS` order. Errors name the offending field.
pub(crate) fn record_params(r: &RequestRecord) -> Result<Vec<Value>, String> {
    let l = &r.labels;
    let text = |s: &str| Value::Text(s.to_owned());
    let real = |v: Option<f64>| v.map_or(Value::Null, Value::Real);
    let int = |v: Option<i64>| v.map_or(Value::Null, Value::Integer);
    Ok(vec![
        text(&r.request_id),
        text(&r.trace_id),
        text(&l.model_id),
        text(&l.runtime),
        text(&l.instance),
        text(&l.tenant),
        text(&l.ab_group),
        text(&l.model_version),
        text(&r.prompt_version),
        text(&r.endpoint),
        Value::Integer(r.stream as i64),
        Value::Integer(r.arrival_unix_ms),
        real(r.upstream_headers_s),
        real(r.first_token_s),
        Value::Real(r.end_s),
        real(r.queue_s),
        Value::Blob(encode_offsets(&r.chunk_offsets_us)),
        Value::Integer(r.gaps.count as i64),
        Value::Real(r.gaps.mean_s),
        Value::Real(r.gaps.max_s),
        int(opt_u64_to_i64(r.prompt_tokens, "prompt_tokens")?),
        int(opt_u64_to_i64(r.output_tokens, "output_tokens")?),
        Value::Integer(r.tokens_from_usage as i64),
        text(&r.finish_reason),
        Value::Integer(r.status as i64),
        r.error_class.map_or(Value::Null, |c| text(c.name())),
        if r.embedding.is_empty() {
            Value::Null
        } else {
            Value::Blob(encode_embedding(&r.embedding))
        },
        // The key's 64 bits as SQLite's signed integer (read back with the same cast).
        r.prefix_key
            .map_or(Value::Null, |k| Value::Integer(k as i64)),
        int(opt_u64_to_i64(r.reasoning_tokens, "reasoning_tokens")?),
        int(opt_u64_to_i64(
            r.cached_input_tokens,
            "cached_input_tokens",
        )?),
        r.cost_usd.map_or(Value::Null, Value::Real),
    ])
}

/// The parameters of one roll-up, in `ROLLUP_COLUMNS` order.
pub(crate) fn rollup_params(r: &RollupRow) -> Result<Vec<Value>, String> {
    let l = &r.labels;
    let text = |s: &str| Value::Text(s.to_owned());
    let count =
        i64::try_from(r.count).map_err(|_| format!("count = {} exceeds i64::MAX", r.count))?;
    Ok(vec![
        text(&l.model_id),
        text(&l.runtime),
        text(&l.instance),
        text(&l.tenant),
        text(&l.ab_group),
        text(&l.model_version),
        text(r.bucket.name()),
        text(r.metric.name()),
        Value::Integer(r.minute_start_unix_ms),
        Value::Integer(count),
        Value::Blob(r.sketch.clone()),
    ])
}

/// Reads columns of one row, turning any type or value error into a `CorruptRow` naming it.
pub(crate) struct RowReader<'r, 's> {
    row: &'r Row<'s>,
    path: &'r Path,
    table: &'static str,
    pub desc: String,
}

impl RowReader<'_, '_> {
    pub fn corrupt(&self, detail: String) -> StoreError {
        StoreError::CorruptRow {
            database: self.path.display().to_string(),
            table: self.table,
            row: self.desc.clone(),
            detail,
        }
    }

    pub fn get<T: FromSql>(&self, idx: usize) -> Result<T, StoreError> {
        self.row
            .get(idx)
            .map_err(|e| self.corrupt(format!("column {}: {e}", self.col(idx))))
    }

    fn col(&self, idx: usize) -> String {
        self.row.as_ref().column_name(idx).unwrap_or("?").to_owned()
    }

    fn get_u64(&self, idx: usize) -> Result<Option<u64>, StoreError> {
        let v: Option<i64> = self.get(idx)?;
        v.map(|n| {
            u64::try_from(n)
                .map_err(|_| self.corrupt(format!("column {}: negative {n}", self.col(idx))))
        })
        .transpose()
    }

    /// NaN is stored by SQLite as NULL; read it back as NaN for non-optional reals.
    fn get_real(&self, idx: usize) -> Result<f64, StoreError> {
        Ok(self.get::<Option<f64>>(idx)?.unwrap_or(f64::NAN))
    }
}

/// Decodes a row of `SELECT id, {RECORD_SELECT}`.
pub(crate) fn record_from_row(row: &Row<'_>, path: &Path) -> Result<RequestRecord, StoreError> {
    let mut rd = RowReader {
        row,
        path,
        table: "records",
        desc: String::new(),
    };
    let id: i64 = rd.get(0)?;
    rd.desc = format!("id {id}");
    let request_id: String = rd.get(1)?;
    rd.desc = format!("id {id}, request_id {request_id:?}");
    let blob: Vec<u8> = rd.get(17)?;
    let chunk_offsets_us = decode_offsets(&blob).map_err(|e| rd.corrupt(e))?;
    let gap_count: i64 = rd.get(18)?;
    let status: i64 = rd.get(25)?;
    let error_class = match rd.get::<Option<String>>(26)? {
        None => None,
        Some(s) => Some(
            ErrorClass::parse(&s)
                .ok_or_else(|| rd.corrupt(format!("unknown error_class {s:?}")))?,
        ),
    };
    let embedding = match rd.get::<Option<Vec<u8>>>(27)? {
        None => Vec::new(),
        Some(b) => decode_embedding(&b).map_err(|e| rd.corrupt(e))?,
    };
    let prefix_key = rd.get::<Option<i64>>(28)?.map(|k| k as u64);
    let reasoning_tokens = rd.get_u64(29)?;
    let cached_input_tokens = rd.get_u64(30)?;
    let cost_usd: Option<f64> = rd.get(31)?;
    Ok(RequestRecord {
        request_id,
        trace_id: rd.get(2)?,
        labels: SeriesLabels {
            model_id: rd.get(3)?,
            runtime: rd.get(4)?,
            instance: rd.get(5)?,
            tenant: rd.get(6)?,
            ab_group: rd.get(7)?,
            model_version: rd.get(8)?,
        },
        prompt_version: rd.get(9)?,
        endpoint: rd.get(10)?,
        stream: rd.get(11)?,
        arrival_unix_ms: rd.get(12)?,
        upstream_headers_s: rd.get(13)?,
        first_token_s: rd.get(14)?,
        end_s: rd.get_real(15)?,
        queue_s: rd.get(16)?,
        chunk_offsets_us,
        gaps: GapSummary {
            count: u32::try_from(gap_count)
                .map_err(|_| rd.corrupt(format!("gap_count {gap_count} out of range")))?,
            mean_s: rd.get_real(19)?,
            max_s: rd.get_real(20)?,
        },
        prompt_tokens: rd.get_u64(21)?,
        output_tokens: rd.get_u64(22)?,
        reasoning_tokens,
        cached_input_tokens,
        cost_usd,
        tokens_from_usage: rd.get(23)?,
        finish_reason: rd.get(24)?,
        status: u16::try_from(status)
            .map_err(|_| rd.corrupt(format!("status {status} out of range")))?,
        error_class,
        embedding,
        prefix_key,
        text: None,
        span: Default::default(),
    })
}

/// Decodes a row of `SELECT {ROLLUP_COLUMNS}`.
pub(crate) fn rollup_from_row(row: &Row<'_>, path: &Path) -> Result<RollupRow, StoreError> {
    let mut rd = RowReader {
        row,
        path,
        table: "rollups",
        desc: String::new(),
    };
    let model_id: String = rd.get(0)?;
    let minute: i64 = rd.get(8)?;
    rd.desc = format!("model_id {model_id:?}, minute_start_unix_ms {minute}");
    let bucket: String = rd.get(6)?;
    let metric: String = rd.get(7)?;
    rd.desc
        .push_str(&format!(", bucket {bucket:?}, metric {metric:?}"));
    let bucket = ContextBucket::parse(&bucket)
        .ok_or_else(|| rd.corrupt(format!("unknown context bucket {bucket:?}")))?;
    let metric = LatencyMetric::parse(&metric)
        .ok_or_else(|| rd.corrupt(format!("unknown latency metric {metric:?}")))?;
    Ok(RollupRow {
        labels: SeriesLabels {
            model_id,
            runtime: rd.get(1)?,
            instance: rd.get(2)?,
            tenant: rd.get(3)?,
            ab_group: rd.get(4)?,
            model_version: rd.get(5)?,
        },
        bucket,
        metric,
        minute_start_unix_ms: minute,
        count: rd.get_u64(9)?.unwrap_or(0),
        sketch: rd.get(10)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_round_trip_little_endian() {
        let v = vec![0, 1, 255, 256, u32::MAX];
        let b = encode_offsets(&v);
        assert_eq!(b.len(), 20);
        assert_eq!(&b[4..8], &[1, 0, 0, 0]);
        assert_eq!(decode_offsets(&b).unwrap(), v);
        assert_eq!(decode_offsets(&[]).unwrap(), Vec::<u32>::new());
        assert!(decode_offsets(&[1, 2, 3]).unwrap_err().contains("3 bytes"));
    }

    #[test]
    fn embeddings_round_trip_little_endian() {
        let v = vec![1.0f32, -0.5, f32::MIN_POSITIVE, 3.25e7];
        let b = encode_embedding(&v);
        assert_eq!(b.len(), 16);
        assert_eq!(&b[0..4], &1.0f32.to_le_bytes());
        assert_eq!(decode_embedding(&b).unwrap(), v);
        assert!(decode_embedding(&[]).unwrap().is_empty());
        assert!(decode_embedding(&[0; 7]).unwrap_err().contains("7 bytes"));
    }

    #[test]
    fn params_match_column_lists() {
        let n = |cols: &str| cols.split(',').count();
        let r = RequestRecord::default();
        assert_eq!(record_params(&r).unwrap().len(), n(RECORD_COLUMNS));
        let row = RollupRow {
            labels: SeriesLabels::default(),
            bucket: ContextBucket::Le512,
            metric: LatencyMetric::Ttft,
            minute_start_unix_ms: 0,
            count: 0,
            sketch: vec![],
        };
        assert_eq!(rollup_params(&row).unwrap().len(), n(ROLLUP_COLUMNS));
    }

    #[test]
    fn oversized_counts_are_refused() {
        let r = RequestRecord {
            prompt_tokens: Some(u64::MAX),
            ..Default::default()
        };
        assert!(record_params(&r).unwrap_err().contains("prompt_tokens"));
    }
}
