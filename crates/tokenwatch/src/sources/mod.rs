// Sources: where data enters tokenwatch. Each source turns what it sees into normalised
// `RequestRecord`s and hands them to the telemetry queue; the streaming proxy is the first.

pub mod proxy;
