// StoreError: every way a store backend can fail, each message naming the database (the SQLite
// path, or the ClickHouse URL and database) and what failed; backend errors are carried boxed.

use std::path::PathBuf;

/// A backend's own error (rusqlite, the HTTP client, ...), boxed so the public type does not
/// depend on any one backend.
pub type BackendError = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(thiserror::Error, Debug)]
pub enum StoreError {
    #[error("cannot create data directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error(
        "cannot open database {path} (damaged, not a SQLite database, or not accessible): {source}"
    )]
    Open { path: PathBuf, source: BackendError },

    /// `database` names the store: the SQLite file, or `clickhouse URL (database NAME)`.
    #[error("database {database}: migration {version} ({name}) failed: {source}")]
    Migration {
        database: String,
        version: i64,
        name: &'static str,
        source: BackendError,
    },

    #[error(
        "database {database} has schema version {found}, newer than this build knows ({known}); \
         use a newer tokenwatch"
    )]
    SchemaTooNew {
        database: String,
        found: i64,
        known: i64,
    },

    /// An operation failed inside the backend (a SQLite error, a response that does not decode).
    #[error("database {database}: {op} failed: {source}")]
    Backend {
        database: String,
        op: &'static str,
        source: BackendError,
    },

    #[error("database {database}: corrupt row in {table} ({row}): {detail}")]
    CorruptRow {
        database: String,
        table: &'static str,
        row: String,
        detail: String,
    },

    #[error("database {database}: cannot store {what}: {detail}")]
    InvalidInput {
        database: String,
        what: String,
        detail: String,
    },

    #[error("database {path}: cannot read file size: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    /// A network backend could not be reached (connection refused, reset, timed out), after
    /// `attempts` tries.
    #[error(
        "database {database}: {op} failed: server unreachable after {attempts} attempt(s): {source}"
    )]
    Unreachable {
        database: String,
        op: &'static str,
        attempts: u32,
        source: BackendError,
    },

    /// A network backend answered with an error: its HTTP status and the server's own message
    /// (for ClickHouse, `Code: N, e.displayText() = DB::Exception: ...`).
    #[error("database {database}: {op} failed: HTTP {status}: {message}")]
    Server {
        database: String,
        op: &'static str,
        status: u16,
        /// The server's error code when it gave one (ClickHouse `Code: N`).
        code: Option<i64>,
        message: String,
    },

    /// The configuration of a backend is not usable (a bad URL, an unreadable password file).
    #[error("store configuration: {0}")]
    Config(String),
}
