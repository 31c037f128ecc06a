// Error type of the simulator crate: start-up, fault-spec and serving errors.
// HTTP-facing errors (OpenAI JSON shape) live in api/error.rs.

use std::net::SocketAddr;

/// Everything that can go wrong while configuring or running the simulator.
#[derive(thiserror::Error, Debug)]
pub enum SimError {
    /// A `--fault` / admin fault spec could not be parsed or is out of range.
    #[error("invalid fault spec `{spec}`: {reason}")]
    InvalidFault { spec: String, reason: String },
    /// A fault or request named a model that this simulator does not serve.
    #[error("unknown model `{model}`; served models: {served}")]
    UnknownModel { model: String, served: String },
    /// A command-line value is out of range or inconsistent.
    #[error("invalid argument: {0}")]
    InvalidArgs(String),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The HTTP server failed while serving.
    #[error("server error: {0}")]
    Serve(#[source] std::io::Error),
}
