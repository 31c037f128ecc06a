// Retention on ClickHouse when the tables carry no TTL (`ttl` off): whole UTC-day partitions
// dropped once all of the day is past the cutoff (`ALTER TABLE t DROP PARTITION 20261201`),
// region text by mutation (`ALTER ... DELETE` takes no query parameters: its few literals are
// quoted); alerts by tombstone in either mode (mod.rs).

use crate::StoreError;
use crate::clickhouse::client::{Client, Params, quote, quote_list};
use crate::clickhouse::query::scalar_u64;
use crate::clickhouse::schema::TEXT;
use crate::text::DEFAULT_REGION;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const DAY_MS: i64 = 86_400_000;
/// How long retention waits for a text-deleting mutation to finish.
const MUTATION_WAIT: Duration = Duration::from_secs(30);

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The end (exclusive, Unix ms) of the UTC day a `YYYYMMDD` partition id names.
fn partition_end_ms(partition: &str) -> Option<i64> {
    let n: i64 = partition.trim_matches('\'').parse().ok()?;
    let (y, m, d) = (n / 10_000, n / 100 % 100, n % 100);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    Some((days_from_civil(y, m, d) + 1) * DAY_MS)
}

/// A table partitioned by day and how to count what a partition holds.
pub(crate) struct DayTable {
    pub table: &'static str,
    /// The table's partition expression (see `schema`).
    pub partition: &'static str,
    /// `SELECT count() ...` over the rows matching `{cond}`: rows, or distinct keys for a
    /// replacing table; None when the report does not count this table.
    pub count: Option<&'static str>,
}

/// Drops every partition of `t` whose day ends at or before `cutoff_ms`; returns the rows
/// they held (by `t.count`).
pub(crate) fn drop_old_partitions(
    client: &Client,
    t: &DayTable,
    cutoff_ms: i64,
    op: &'static str,
) -> Result<u64, StoreError> {
    let db = client.database();
    let mut p = Params::default();
    let sql = format!(
        "SELECT DISTINCT partition FROM {} WHERE database = {} AND table = {} \
         AND active FORMAT TSV",
        client.layout().system("parts"),
        p.str(db),
        p.str(&client.layout().local(t.table))
    );
    let body = client.query_with(op, &sql, &p, false)?;
    let text = String::from_utf8_lossy(&body);
    let mut deleted = 0u64;
    for p in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let Some(end) = partition_end_ms(p) else {
            tracing::warn!(database = %client.label(), table = t.table, partition = p, "partition id is not a day; left alone");
            continue;
        };
        if end > cutoff_ms {
            continue;
        }
        let p = p.trim_matches('\'');
        if let Some(count) = t.count {
            let cond = format!("{} = {p}", t.partition);
            let sql = count
                .replace("{t}", &format!("{db}.{}", t.table))
                .replace("{cond}", &cond);
            deleted += scalar_u64(client, op, &sql, &Params::default())?;
        }
        client.ddl(
            op,
            &format!("ALTER TABLE {db}.{} DROP PARTITION {p}", t.table),
            true,
        )?;
        tracing::debug!(database = %client.label(), table = t.table, partition = p, "dropped partition");
    }
    Ok(deleted)
}

/// Captured text past its region's retention (regions not listed use `default`), deleted by
/// mutation; waits for the mutation so a read right after no longer sees the text. Text older
/// than the raw retention goes with its day partition (`drop_old_partitions`).
pub(crate) fn delete_region_text(
    client: &Client,
    now_unix_ms: i64,
    raw_cutoff: i64,
    regions: &BTreeMap<String, Duration>,
) -> Result<u64, StoreError> {
    let db = client.database();
    let cutoff = |keep: &Duration| {
        now_unix_ms
            .saturating_sub(i64::try_from(keep.as_millis()).unwrap_or(i64::MAX))
            .max(raw_cutoff)
    };
    let listed: Vec<&str> = regions
        .keys()
        .map(String::as_str)
        .filter(|r| *r != DEFAULT_REGION)
        .collect();
    let before = |keep: &Duration| format!("fromUnixTimestamp64Milli({}, 'UTC')", cutoff(keep));
    let mut conds = Vec::new();
    for region in &listed {
        conds.push(format!(
            "(region = {} AND arrival_unix_ms < {})",
            quote(region),
            before(&regions[*region])
        ));
    }
    if let Some(keep) = regions.get(DEFAULT_REGION) {
        let rest = if listed.is_empty() {
            String::new()
        } else {
            format!(
                " AND region NOT IN ({})",
                quote_list(listed.iter().copied())
            )
        };
        conds.push(format!("(arrival_unix_ms < {}{rest})", before(keep)));
    }
    if conds.is_empty() {
        return Ok(0);
    }
    let cond = conds.join(" OR ");
    let op = "retention of captured text";
    let n = scalar_u64(
        client,
        op,
        &format!("SELECT count() FROM {db}.{TEXT} WHERE {cond}"),
        &Params::default(),
    )?;
    if n == 0 {
        return Ok(0);
    }
    client.ddl(
        op,
        &format!("ALTER TABLE {db}.{TEXT} DELETE WHERE {cond}"),
        true,
    )?;
    let deadline = Instant::now() + MUTATION_WAIT;
    let mut p = Params::default();
    let pending = format!(
        "SELECT count() FROM {} WHERE database = {} AND table = {} \
         AND is_done = 0",
        client.layout().system("mutations"),
        p.str(db),
        p.str(&client.layout().local(TEXT))
    );
    while scalar_u64(client, op, &pending, &p)? > 0 {
        if Instant::now() > deadline {
            tracing::warn!(database = %client.label(), "deleting captured text is still running; it finishes in the background");
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_ids_map_to_day_ends() {
        assert_eq!(partition_end_ms("19700101"), Some(DAY_MS));
        // 2023-11-14 00:00 UTC = 1699920000 s.
        assert_eq!(
            partition_end_ms("20231114"),
            Some(1_699_920_000_000 + DAY_MS)
        );
        assert_eq!(
            partition_end_ms("20240229"),
            Some(1_709_164_800_000 + DAY_MS)
        );
        assert_eq!(partition_end_ms("tuple()"), None);
        assert_eq!(partition_end_ms("20241301"), None);
    }
}
