// The simulator's end-to-end tests as one test binary (one build and link for all of them):
// its HTTP API, its latency model and its streaming formats, each a module, over the shared
// helpers in `common` that start a simulator on port 0.

mod common;
mod http_api;
mod latency;
mod streaming_apis;
