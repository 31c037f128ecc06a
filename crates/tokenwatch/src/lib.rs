// tokenwatch as a library: every pipeline stage of the binary, so benchmarks, fuzz targets and
// tests can reach them. Data flows sources → pipeline → store/export → detect/alert → act → API.

pub mod act;
pub mod alerting;
pub mod api;
pub mod app;
pub mod audit;
pub mod auth;
pub mod capture;
pub mod config;
pub mod dashboards;
pub mod demo;
pub mod embed;
pub mod export;
pub mod kernel;
pub mod listen;
pub mod logs;
pub mod markers;
pub mod pipeline;
pub mod reload;
pub mod runtimes;
pub mod sources;
pub mod top;
pub mod traffic;
pub mod ui;
pub mod writer_id;

#[cfg(test)]
mod architecture_tests;
