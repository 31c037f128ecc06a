// The SQLite store's integration tests as one test binary (one build and link): alerts,
// annotations, kill -9 crash safety, embeddings and captured text, each a module, every one
// against a store in its own temporary directory.

mod alerts;
mod annotations;
mod crash;
mod embeddings;
mod text;
