// The writer id: this instance's stable name in shared-store keys (`store.writer_id`, or one
// derived once from hostname + listen addresses + data directory and kept in the data dir).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The file in the data directory that keeps a derived writer id across restarts.
pub const WRITER_ID_FILE: &str = "writer_id";

/// Longest writer id accepted.
pub const MAX_LEN: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum WriterIdError {
    #[error("store.writer_id {0:?}: expected 1-128 characters of A-Z a-z 0-9 . _ : -")]
    Invalid(String),
    #[error("writer id file {path}: {detail}")]
    File { path: PathBuf, detail: String },
}

/// Whether `id` may be a writer id: 1–128 ASCII letters, digits, `.`, `_`, `:` or `-`.
pub fn is_valid(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// The writer id of an instance: `configured` when set; else the one kept in
/// `data_dir/writer_id`; else one derived from the hostname, `listen` addresses and `data_dir`,
/// written there so that a restart (even with other addresses) keeps it.
pub fn resolve(
    configured: Option<&str>,
    data_dir: &Path,
    listen: &[SocketAddr],
) -> Result<String, WriterIdError> {
    if let Some(id) = configured {
        let id = id.trim();
        return if is_valid(id) {
            Ok(id.to_string())
        } else {
            Err(WriterIdError::Invalid(id.to_string()))
        };
    }
    let path = data_dir.join(WRITER_ID_FILE);
    let file_err = |e: std::io::Error| WriterIdError::File {
        path: path.clone(),
        detail: e.to_string(),
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let id = text.trim();
            if is_valid(id) {
                return Ok(id.to_string());
            }
            return Err(WriterIdError::File {
                path: path.clone(),
                detail: format!("{id:?} is not a writer id (delete the file to derive a new one)"),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(file_err(e)),
    }
    let id = derive(&hostname(), listen, data_dir);
    std::fs::create_dir_all(data_dir).map_err(file_err)?;
    // Written whole to a temporary file and renamed: a crash never leaves half an id.
    let tmp = data_dir.join(format!("{WRITER_ID_FILE}.tmp"));
    std::fs::write(&tmp, format!("{id}\n")).map_err(file_err)?;
    std::fs::rename(&tmp, &path).map_err(file_err)?;
    Ok(id)
}

/// `HOST-HASH`: the hostname (cut to its allowed characters) and 16 hex digits of the SHA-256
/// of hostname, addresses and the absolute data directory.
pub fn derive(hostname: &str, listen: &[SocketAddr], data_dir: &Path) -> String {
    use sha2::{Digest, Sha256};
    let dir = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let mut h = Sha256::new();
    h.update(hostname.as_bytes());
    for a in listen {
        h.update(b"\0");
        h.update(a.to_string().as_bytes());
    }
    h.update(b"\0");
    h.update(dir.to_string_lossy().as_bytes());
    let digest = h.finalize();
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let host: String = hostname
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(MAX_LEN - hex.len() - 1)
        .collect();
    if host.is_empty() {
        hex
    } else {
        format!("{host}-{hex}")
    }
}

/// The kernel's hostname (Linux), else `$HOSTNAME`, else empty.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs() -> Vec<SocketAddr> {
        vec![
            "127.0.0.1:9464".parse().unwrap(),
            "127.0.0.1:8080".parse().unwrap(),
        ]
    }

    #[test]
    fn a_configured_id_wins_and_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            resolve(Some(" proxy-a "), dir.path(), &addrs()).unwrap(),
            "proxy-a"
        );
        assert!(
            !dir.path().join(WRITER_ID_FILE).exists(),
            "nothing derived or written"
        );
        for bad in ["", "a b", "x/y", &"x".repeat(MAX_LEN + 1)] {
            let err = resolve(Some(bad), dir.path(), &addrs()).unwrap_err();
            assert!(matches!(err, WriterIdError::Invalid(_)), "{bad:?}: {err}");
            assert!(err.to_string().contains("store.writer_id"), "{err}");
        }
    }

    #[test]
    fn a_derived_id_is_kept_in_the_data_dir_across_other_addresses() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let first = resolve(None, &data, &addrs()).unwrap();
        assert!(is_valid(&first), "{first}");
        let kept = std::fs::read_to_string(data.join(WRITER_ID_FILE)).unwrap();
        assert_eq!(kept.trim(), first);
        let other: Vec<SocketAddr> = vec!["127.0.0.1:1".parse().unwrap()];
        assert_eq!(
            resolve(None, &data, &other).unwrap(),
            first,
            "the kept id, not a new one"
        );
        std::fs::write(data.join(WRITER_ID_FILE), "not valid!\n").unwrap();
        let err = resolve(None, &data, &addrs()).unwrap_err().to_string();
        assert!(
            err.contains(WRITER_ID_FILE) && err.contains("not a writer id"),
            "{err}"
        );
    }

    #[test]
    fn derived_ids_differ_by_address_and_directory_only() {
        let a = derive("host-1", &addrs(), Path::new("/d/a"));
        assert_eq!(
            a,
            derive("host-1", &addrs(), Path::new("/d/a")),
            "deterministic"
        );
        assert!(
            a.starts_with("host-1-") && a.len() == "host-1-".len() + 16,
            "{a}"
        );
        assert_ne!(a, derive("host-1", &addrs(), Path::new("/d/b")));
        assert_ne!(a, derive("host-1", &addrs()[..1], Path::new("/d/a")));
        assert_ne!(a, derive("host-2", &addrs(), Path::new("/d/a")));
        let odd = derive("h ö/st", &addrs(), Path::new("/d"));
        assert!(is_valid(&odd) && odd.starts_with("hst-"), "{odd}");
        assert!(is_valid(&derive("", &addrs(), Path::new("/d"))));
    }
}
