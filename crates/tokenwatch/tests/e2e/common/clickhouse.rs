// A ClickHouse server for integration tests (Debian's clickhouse-server on two free loopback
// ports from `free_addr`, its own data directory, small caches), killed when dropped.

pub use tokenwatch_store::testing::ClickHouseServer;

/// Start a server; panics with its log (or the missing package) when it does not come up.
pub fn start_clickhouse() -> ClickHouseServer {
    let mut last = String::new();
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
