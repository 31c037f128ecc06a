// tokenwatch-core: the data model and the aggregation stage of the pipeline
// (sources → normalise → **aggregate** → store/export). No I/O lives here.

pub mod aggregate;
pub mod alert;
pub mod backoff;
pub mod clock;
pub mod counts;
pub mod embedding;
pub mod exposition;
pub mod histogram;
pub mod model;
pub mod placement;
pub mod runtime_latency;
pub mod scores;
pub mod signals;
pub mod sketch;
pub mod window;
