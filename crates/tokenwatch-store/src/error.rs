// StoreError: every way the store can fail, each message naming the database path and what
// failed (the operation, the migration, or the corrupt row).

use std::path::PathBuf;

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
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },

    #[error("database {path}: migration {version} ({name}) failed: {source}")]
    Migration {
        path: PathBuf,
        version: i64,
        name: &'static str,
        source: rusqlite::Error,
    },

    #[error(
        "database {path} has schema version {found}, newer than this build knows ({known}); \
         use a newer tokenwatch"
    )]
    SchemaTooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },

    #[error("database {path}: {op} failed: {source}")]
    Sqlite {
        path: PathBuf,
        op: &'static str,
        source: rusqlite::Error,
    },

    #[error("database {path}: corrupt row in {table} ({row}): {detail}")]
    CorruptRow {
        path: PathBuf,
        table: &'static str,
        row: String,
        detail: String,
    },

    #[error("database {path}: cannot store {what}: {detail}")]
    InvalidInput {
        path: PathBuf,
        what: String,
        detail: String,
    },

    #[error("database {path}: cannot read file size: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}
