// tokenwatch-sim: an OpenAI-compatible simulated LLM inference server (continuous
// batching, KV cache, vLLM /metrics, dcgm GPU series, switchable faults).

//! Entry points: [`serve`] (on a given listener, until a shutdown future resolves) and
//! [`run`] (binds `--listen`, serves until Ctrl-C).
//!
//! Modules: `args` (command-line options), `fault` (fault specs and the active-fault
//! board), `engine` (per-model batcher and its tokio task), `metrics` (stats and
//! Prometheus text), `gpu` (simulated GPU readings), `vocab` (token text), `api` (routes).

pub mod api;
mod args;
pub mod engine;
mod error;
pub mod fault;
pub mod gpu;
pub mod metrics;
mod vocab;

pub use args::{ReasoningField, SimArgs};
pub use error::SimError;
pub use fault::{FaultKind, FaultSpec, parse_fault};

use std::future::Future;
use std::sync::Arc;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;

use crate::api::{AppState, Reasoning, router};
use crate::engine::EngineHandle;
use crate::fault::FaultBoard;

/// Serve the simulator on `listener` until `shutdown` resolves (then drain gracefully).
pub async fn serve(
    args: SimArgs,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), SimError> {
    let configs = args.engine_configs()?;
    let models: Vec<String> = configs.iter().map(|c| c.model.clone()).collect();
    let board = Arc::new(FaultBoard::default());
    for f in &args.fault {
        let spec = parse_fault(f)?;
        if let Some(m) = spec.model.as_ref().filter(|m| !models.contains(m)) {
            return Err(SimError::UnknownModel {
                model: m.clone(),
                served: models.join(", "),
            });
        }
        tracing::info!(fault = spec.name(), model = ?spec.model, "fault enabled at start");
        board.enable(spec);
    }
    let engines: Vec<EngineHandle> = configs
        .into_iter()
        .map(|c| EngineHandle::spawn(c, Arc::clone(&board)))
        .collect();
    let state = AppState::new(
        engines,
        board,
        args.instance_name.clone(),
        args.gpu_name.clone(),
        Reasoning {
            tokens: args.reasoning_tokens,
            field: args.reasoning_field,
        },
        args.stream_headers_at_first_token,
        args.enable_prompt_tokens_details,
    );
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, models = %models.join(","), "simulator listening");
    }
    // axum::serve leaves Nagle's algorithm on: the first small SSE chunk after the response
    // headers would then wait for the client's delayed ACK (~40 ms on Linux).
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY on an accepted connection");
        }
    });
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(SimError::Serve)
}

/// Bind `args.listen` and serve until Ctrl-C.
pub async fn run(args: SimArgs) -> Result<(), SimError> {
    let addr = args.listen;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| SimError::Bind { addr, source })?;
    serve(args, listener, async {
        // If the signal handler cannot be installed, serve until the process is killed.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    })
    .await
}
