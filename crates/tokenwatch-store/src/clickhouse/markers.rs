// Markers on ClickHouse: one row per insert in a day-partitioned table; the first row of an id
// is the marker (a re-sent insert is ignored at query time with `LIMIT 1 BY id`).

use crate::clickhouse::client::{Client, Params};
use crate::clickhouse::rowbinary::{Reader, Writer};
use crate::clickhouse::schema::MARKERS;
use crate::{MarkerQuery, MarkerRow, StoreError};

pub(crate) const COLUMNS: &str =
    "id, kind, model, from_version, to_version, source, at_unix_ms, note, seq";

/// RowBinary rows, `seq` onwards.
pub(crate) fn rows(list: &[MarkerRow], seq: u64) -> Vec<u8> {
    let mut w = Writer::default();
    for (i, r) in list.iter().enumerate() {
        w.str(&r.id);
        w.str(&r.kind);
        w.str(&r.model);
        w.str(&r.from_version);
        w.str(&r.to_version);
        w.str(&r.source);
        w.i64(r.at_unix_ms);
        w.str(&r.note);
        w.u64(seq + i as u64);
    }
    w.buf
}

/// The newest `q.limit` matching markers, oldest first (by time, then id).
pub(crate) fn query(client: &Client, q: &MarkerQuery) -> Result<Vec<MarkerRow>, StoreError> {
    if q.limit == 0 {
        return Ok(Vec::new());
    }
    let mut p = Params::default();
    let mut conds = Vec::new();
    if let Some(id) = &q.id {
        conds.push(format!("id = {}", p.str(id)));
    }
    if let Some(m) = &q.model {
        conds.push(format!("model = {}", p.str(m)));
    }
    if let Some(since) = q.since_unix_ms {
        conds.push(format!("at_unix_ms >= {}", p.ms(since)));
    }
    let filter = if conds.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conds.join(" AND "))
    };
    let sql = format!(
        "SELECT id, kind, model, from_version, to_version, source, at_unix_ms, note FROM \
         (SELECT id, kind, model, from_version, to_version, source, at_unix_ms, note \
         FROM {db}.{MARKERS} ORDER BY id, seq LIMIT 1 BY id){filter} \
         ORDER BY at_unix_ms DESC, id DESC LIMIT {limit} FORMAT RowBinary",
        db = client.database(),
        limit = p.u64(u64::try_from(q.limit).unwrap_or(u64::MAX))
    );
    let body = client.query_with("query_markers", &sql, &p, true)?;
    let mut r = Reader::new(&body);
    let mut out = Vec::new();
    while !r.is_empty() {
        let row = decode(&mut r).map_err(|detail| StoreError::CorruptRow {
            database: client.label().to_string(),
            table: MARKERS,
            row: format!("row {} of the answer", out.len()),
            detail,
        })?;
        out.push(row);
    }
    out.reverse();
    Ok(out)
}

fn decode(r: &mut Reader<'_>) -> Result<MarkerRow, String> {
    Ok(MarkerRow {
        id: r.string()?,
        kind: r.string()?,
        model: r.string()?,
        from_version: r.string()?,
        to_version: r.string()?,
        source: r.string()?,
        at_unix_ms: r.i64()?,
        note: r.string()?,
    })
}
