// A ClickHouse server for integration tests (ClickHouse 26.9 through the repository's chDB
// stand-in, scripts/clickhouse-chdb, on free loopback ports from `free_addr`, its own data
// directory), killed when dropped.

pub use tokenwatch_store::testing::ClickHouseServer;

/// Start a server; panics with its log (or the missing chdb virtualenv) when it does not come up.
pub fn start_clickhouse() -> ClickHouseServer {
    let mut last = String::new();
    // The server (clickhouse-chdb) is given its ports and cannot report ones it picked.
    for _ in 0..3 {
        match ClickHouseServer::try_start(super::free_addr(), super::free_addr()) {
            Ok(server) => return server,
            // A port taken between the check and the server's bind: try two other ports.
            Err(log) if log.contains("Address already in use") => last = log,
            Err(log) => panic!("clickhouse-server did not start:\n{log}"),
        }
    }
    panic!("clickhouse-server did not start:\n{last}")
}
