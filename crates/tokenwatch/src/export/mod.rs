// Export stage: what leaves tokenwatch for other tools. Today the Prometheus `/metrics`
// exposition; remote write and ClickHouse will sit beside it as further sinks.

pub mod prometheus;
