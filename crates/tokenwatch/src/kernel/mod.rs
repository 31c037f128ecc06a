// The shared kernel of the binary's stages: what every stage may import and that imports no
// stage. The outbound TLS client lives here (the proxy's https upstreams, OTLP export, remote
// write and webhooks all dial through it), and the route split tables the proxy picks from and
// canary rollback acts on; the clock and the record and signal types are in the
// `tokenwatch-core` crate.

pub mod duration;
pub mod splits;
pub mod telemetry;
pub mod tls;
