// Tables on a ClickHouse cluster (`store.clickhouse.cluster`): every table the code names is a
// `Distributed` table in front of a `Replicated*` table named `<table>_local`, both created
// `ON CLUSTER`; reads and inserts go through the distributed one, sharded by the first column of
// the table's sorting key (rows a ReplacingMergeTree replaces share it, so they meet on one
// shard); schema changes, TTLs, partition drops and mutations go to the local tables on every
// node. `schema_migrations` is replicated to every node and not sharded. The statements the
// schema and retention write for one server are rewritten here, one place for the cluster form.

use crate::StoreError;

/// The ZooKeeper/Keeper path of a sharded table's replicas (server macros: `{shard}`,
/// `{replica}` from the server's configuration; `{database}`, `{table}` filled in by the server).
const SHARDED_PATH: &str = "/clickhouse/tables/{shard}/{database}/{table}";
/// The path of a table every node holds whole (one shard).
const UNSHARDED_PATH: &str = "/clickhouse/tables/{database}/{table}";
/// Tables every node holds whole, read locally and never sharded.
const UNSHARDED: [&str; 1] = ["schema_migrations"];

/// How statements reach the server: one node, or a cluster by name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum Layout {
    #[default]
    Single,
    Cluster(String),
}

impl Layout {
    /// From `store.clickhouse.cluster` (None or empty: one node); a name is an identifier.
    pub(crate) fn new(cluster: Option<&str>) -> Result<Layout, StoreError> {
        match cluster.map(str::trim).filter(|c| !c.is_empty()) {
            None => Ok(Layout::Single),
            Some(c) if super::client::valid_identifier(c) => Ok(Layout::Cluster(c.to_string())),
            Some(c) => Err(StoreError::Config(format!(
                "clickhouse cluster {c:?}: letters, digits and _ only, not starting with a digit"
            ))),
        }
    }

    pub(crate) fn cluster(&self) -> Option<&str> {
        match self {
            Layout::Single => None,
            Layout::Cluster(c) => Some(c),
        }
    }

    /// The table that holds the rows of `table` (what `system.tables`, `system.parts` and
    /// `system.mutations` list).
    pub(crate) fn local(&self, table: &str) -> String {
        match self {
            Layout::Cluster(_) if !UNSHARDED.contains(&table) => format!("{table}_local"),
            _ => table.to_string(),
        }
    }

    /// `system.<name>` on this node, or on every replica of the cluster.
    pub(crate) fn system(&self, name: &str) -> String {
        match self {
            Layout::Single => format!("system.{name}"),
            Layout::Cluster(c) => format!("clusterAllReplicas({c}, system.{name})"),
        }
    }

    /// The statements that do what `sql` (written for one server) does on this layout: itself
    /// on one node; on a cluster, `CREATE DATABASE`, `CREATE TABLE`, `ALTER TABLE` and
    /// `DROP TABLE` in their `ON CLUSTER` forms (see the module comment). Other statements are
    /// returned unchanged.
    pub(crate) fn statements(&self, sql: &str) -> Result<Vec<String>, StoreError> {
        let Layout::Cluster(c) = self else {
            return Ok(vec![sql.to_string()]);
        };
        let sql = sql.trim();
        if let Some(db) = sql.strip_prefix("CREATE DATABASE IF NOT EXISTS ") {
            return Ok(vec![format!(
                "CREATE DATABASE IF NOT EXISTS {} ON CLUSTER {c}",
                db.trim()
            )]);
        }
        if let Some(rest) = sql.strip_prefix("CREATE TABLE IF NOT EXISTS ") {
            return create_table(c, rest)
                .map_err(|e| StoreError::Config(format!("cluster form of {:?}: {e}", short(sql))));
        }
        if let Some(rest) = sql.strip_prefix("ALTER TABLE ") {
            let (table, change) = rest
                .split_once(' ')
                .ok_or_else(|| StoreError::Config(format!("ALTER without a change: {sql:?}")))?;
            let (db, name) = split_table(table);
            let local = format!(
                "ALTER TABLE {db}.{} ON CLUSTER {c} {change}",
                self.local(name)
            );
            // Columns change on both tables (the distributed one lists them too); TTLs,
            // partitions and mutations concern the rows, on the local tables only.
            let column = [
                "ADD COLUMN",
                "DROP COLUMN",
                "MODIFY COLUMN",
                "RENAME COLUMN",
            ]
            .iter()
            .any(|k| change.trim_start().starts_with(k));
            return Ok(if column && !UNSHARDED.contains(&name) {
                vec![
                    local,
                    format!("ALTER TABLE {table} ON CLUSTER {c} {change}"),
                ]
            } else {
                vec![local]
            });
        }
        if let Some(table) = sql.strip_prefix("DROP TABLE IF EXISTS ") {
            let (db, name) = split_table(table.trim());
            let mut out = vec![format!("DROP TABLE IF EXISTS {db}.{name} ON CLUSTER {c}")];
            if !UNSHARDED.contains(&name) {
                out.push(format!(
                    "DROP TABLE IF EXISTS {db}.{} ON CLUSTER {c}",
                    self.local(name)
                ));
            }
            return Ok(out);
        }
        Ok(vec![sql.to_string()])
    }
}

/// `db.name` → (`db`, `name`).
fn split_table(table: &str) -> (&str, &str) {
    table.split_once('.').unwrap_or(("", table))
}

/// The start of a statement, for error messages.
fn short(sql: &str) -> String {
    sql.chars().take(80).collect()
}

/// `CREATE TABLE IF NOT EXISTS` + `rest` (`db.name (columns) ENGINE = E[(args)] clauses`) as
/// the replicated local table and, unless unsharded, the distributed table in front of it.
fn create_table(cluster: &str, rest: &str) -> Result<Vec<String>, String> {
    let open = rest.find(" (").ok_or("no column list")?;
    let table = &rest[..open];
    let (db, name) = split_table(table);
    let engine_at = rest.rfind(") ENGINE = ").ok_or("no ENGINE")?;
    let columns = &rest[open + 1..=engine_at];
    let engine_text = &rest[engine_at + ") ENGINE = ".len()..];
    let engine_end = engine_text
        .find(|ch: char| ch == '(' || ch.is_whitespace())
        .unwrap_or(engine_text.len());
    let engine = &engine_text[..engine_end];
    if !engine.ends_with("MergeTree") || engine.starts_with("Replicated") {
        return Err(format!("engine {engine} has no replicated form here"));
    }
    let mut after = &engine_text[engine_end..];
    let mut args = "";
    if let Some(inner) = after.strip_prefix('(') {
        let close = inner.find(')').ok_or("engine arguments not closed")?;
        args = &inner[..close];
        after = &inner[close + 1..];
    }
    let unsharded = UNSHARDED.contains(&name);
    let path = if unsharded {
        UNSHARDED_PATH
    } else {
        SHARDED_PATH
    };
    let mut engine_args = format!("'{path}', '{{replica}}'");
    if !args.trim().is_empty() {
        engine_args.push_str(", ");
        engine_args.push_str(args.trim());
    }
    let local = if unsharded {
        name.to_string()
    } else {
        format!("{name}_local")
    };
    let mut out = vec![format!(
        "CREATE TABLE IF NOT EXISTS {db}.{local} ON CLUSTER {cluster} {columns} ENGINE = \
         Replicated{engine}({engine_args}){after}"
    )];
    if !unsharded {
        let key = sharding_column(after).ok_or("no ORDER BY")?;
        out.push(format!(
            "CREATE TABLE IF NOT EXISTS {db}.{name} ON CLUSTER {cluster} AS {db}.{local} \
             ENGINE = Distributed({cluster}, {db}, {local}, cityHash64({key}))"
        ));
    }
    Ok(out)
}

/// The first column of the `ORDER BY` in a table's clauses.
fn sharding_column(clauses: &str) -> Option<&str> {
    let order = &clauses[clauses.find("ORDER BY ")? + "ORDER BY ".len()..];
    let order = order.trim_start().trim_start_matches('(');
    let end = order
        .find(|ch: char| ch == ',' || ch == ')' || ch.is_whitespace())
        .unwrap_or(order.len());
    let column = &order[..end];
    (!column.is_empty()).then_some(column)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> Layout {
        Layout::new(Some("tw_cluster")).unwrap()
    }

    #[test]
    fn one_node_keeps_every_statement_and_names() {
        let one = Layout::new(None).unwrap();
        assert_eq!(one, Layout::new(Some(" ")).unwrap());
        let sql = "CREATE TABLE IF NOT EXISTS tw.t (a UInt8) ENGINE = MergeTree ORDER BY a";
        assert_eq!(one.statements(sql).unwrap(), [sql]);
        assert_eq!(one.local("records_v6"), "records_v6");
        assert_eq!(one.system("parts"), "system.parts");
        assert!(Layout::new(Some("bad name")).is_err());
        assert!(Layout::new(Some("1st")).is_err());
    }

    #[test]
    fn a_table_becomes_a_replicated_local_table_behind_a_distributed_one() {
        let sql = "CREATE TABLE IF NOT EXISTS tw.rollups_v6 (metric String, seq UInt64, \
                   INDEX i metric TYPE bloom_filter(0.001) GRANULARITY 1) \
                   ENGINE = ReplacingMergeTree(seq) PARTITION BY toYYYYMMDD(m) \
                   ORDER BY (metric, seq) SETTINGS ttl_only_drop_parts = 1";
        let out = cluster().statements(sql).unwrap();
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(
            out[0],
            "CREATE TABLE IF NOT EXISTS tw.rollups_v6_local ON CLUSTER tw_cluster (metric String, \
             seq UInt64, INDEX i metric TYPE bloom_filter(0.001) GRANULARITY 1) ENGINE = \
             ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', \
             '{replica}', seq) PARTITION BY toYYYYMMDD(m) ORDER BY (metric, seq) SETTINGS \
             ttl_only_drop_parts = 1"
        );
        assert_eq!(
            out[1],
            "CREATE TABLE IF NOT EXISTS tw.rollups_v6 ON CLUSTER tw_cluster AS tw.rollups_v6_local \
             ENGINE = Distributed(tw_cluster, tw, rollups_v6_local, cityHash64(metric))"
        );
        // No engine arguments, a one-column sorting key.
        let out = cluster()
            .statements(
                "CREATE TABLE IF NOT EXISTS tw.a (id String) ENGINE = MergeTree ORDER BY id",
            )
            .unwrap();
        assert!(out[0].contains("ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}') ORDER BY id"), "{out:?}");
        assert!(out[1].ends_with("cityHash64(id))"), "{out:?}");
    }

    #[test]
    fn migrations_are_replicated_whole_on_every_node() {
        let out = cluster()
            .statements(
                "CREATE TABLE IF NOT EXISTS tw.schema_migrations (version UInt32) \
                 ENGINE = MergeTree ORDER BY version",
            )
            .unwrap();
        assert_eq!(
            out,
            [
                "CREATE TABLE IF NOT EXISTS tw.schema_migrations ON CLUSTER tw_cluster (version \
              UInt32) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{database}/{table}', \
              '{replica}') ORDER BY version"
            ]
        );
        assert_eq!(cluster().local("schema_migrations"), "schema_migrations");
    }

    #[test]
    fn alters_reach_the_local_tables_and_columns_both() {
        let c = cluster();
        assert_eq!(
            c.statements(
                "ALTER TABLE tw.records_v6 MODIFY TTL arrival_unix_ms + toIntervalSecond(60)"
            )
            .unwrap(),
            [
                "ALTER TABLE tw.records_v6_local ON CLUSTER tw_cluster MODIFY TTL arrival_unix_ms + toIntervalSecond(60)"
            ]
        );
        assert_eq!(
            c.statements("ALTER TABLE tw.records_v6 ADD COLUMN IF NOT EXISTS x UInt8")
                .unwrap(),
            [
                "ALTER TABLE tw.records_v6_local ON CLUSTER tw_cluster ADD COLUMN IF NOT EXISTS x UInt8",
                "ALTER TABLE tw.records_v6 ON CLUSTER tw_cluster ADD COLUMN IF NOT EXISTS x UInt8"
            ]
        );
        assert_eq!(
            c.statements("DROP TABLE IF EXISTS tw.records").unwrap(),
            [
                "DROP TABLE IF EXISTS tw.records ON CLUSTER tw_cluster",
                "DROP TABLE IF EXISTS tw.records_local ON CLUSTER tw_cluster"
            ]
        );
        assert_eq!(
            c.statements("CREATE DATABASE IF NOT EXISTS tw").unwrap(),
            ["CREATE DATABASE IF NOT EXISTS tw ON CLUSTER tw_cluster"]
        );
        assert_eq!(
            c.system("parts"),
            "clusterAllReplicas(tw_cluster, system.parts)"
        );
        let select = "SELECT 1";
        assert_eq!(c.statements(select).unwrap(), [select]);
    }
}
