// The tokens file (`ROLE TOKEN [NAME]` per line) parsed into SHA-256 digests with their roles and
// caller names, and the constant-time lookup of a presented token. Errors never contain a token.

use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// Shortest token accepted: shorter ones are guessable (`openssl rand -hex 32` makes 64).
pub const MIN_TOKEN_CHARS: usize = 16;
/// Longest token accepted (a bearer header value stays well inside header limits).
pub const MAX_TOKEN_CHARS: usize = 1024;
/// Longest caller name accepted (the optional third field).
pub const MAX_NAME_CHARS: usize = 64;

/// What a token may do. `admin` includes `read` and `ingest`; `read` and `ingest` are separate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Read,
    Admin,
    Ingest,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Admin => "admin",
            Role::Ingest => "ingest",
        }
    }

    fn parse(s: &str) -> Option<Role> {
        match s {
            "read" => Some(Role::Read),
            "admin" => Some(Role::Admin),
            "ingest" => Some(Role::Ingest),
            _ => None,
        }
    }

    /// Whether a token of this role may do what `needed` allows.
    pub fn grants(self, needed: Role) -> bool {
        self == Role::Admin || self == needed
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error("{file}: cannot read the tokens file: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}:{line}: {message}")]
    Line {
        file: String,
        line: usize,
        message: String,
    },
    #[error(
        "{file}: no tokens (every request would be refused); write one `ROLE TOKEN` line per token, ROLE one of read, admin, ingest"
    )]
    Empty { file: String },
}

struct Entry {
    digest: [u8; 32],
    role: Role,
    /// The line's NAME, else `ROLE#LINE` (never any part of the token).
    name: Arc<str>,
}

/// A caller name: ASCII letters, digits and `-_.@:`, at most `MAX_NAME_CHARS`.
fn valid_name(name: &str) -> bool {
    name.len() <= MAX_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@:".contains(&b))
}

/// The configured tokens, held only as SHA-256 digests.
pub struct TokenSet {
    entries: Vec<Entry>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl TokenSet {
    /// Read and parse the file at `path`.
    pub fn load(path: &Path) -> Result<TokenSet, TokensError> {
        let file = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| TokensError::Read {
            file: file.clone(),
            source,
        })?;
        TokenSet::from_bytes(&bytes, &file)
    }

    /// Parse the file's bytes, which must be UTF-8 text.
    pub fn from_bytes(bytes: &[u8], file: &str) -> Result<TokenSet, TokensError> {
        match std::str::from_utf8(bytes) {
            Ok(text) => TokenSet::parse(text, file),
            Err(e) => {
                let line = 1 + bytes[..e.valid_up_to()]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count();
                Err(TokensError::Line {
                    file: file.to_string(),
                    line,
                    message: "not UTF-8 text".into(),
                })
            }
        }
    }

    /// Parse the file's text: `ROLE TOKEN [NAME]` per line, `#` comments and blank lines allowed.
    pub fn parse(text: &str, file: &str) -> Result<TokenSet, TokensError> {
        let mut entries: Vec<Entry> = Vec::new();
        let mut lines_of: Vec<usize> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let err = |message: String| TokensError::Line {
                file: file.to_string(),
                line,
                message,
            };
            let content = raw.trim();
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = content.split_whitespace().collect();
            // No field is ever quoted back: a line written the wrong way round holds a token first.
            let role = Role::parse(fields[0]).ok_or_else(|| {
                err("the first field is not a role: expected `read`, `admin` or `ingest` followed by the token (the line is not shown: it may hold a token)".into())
            })?;
            let (token, name) = match fields.len() {
                2 => (fields[1], None),
                3 => (fields[1], Some(fields[2])),
                1 => {
                    return Err(err(format!(
                        "`{}` has no token: expected `{} TOKEN`",
                        role.name(),
                        role.name()
                    )));
                }
                n => {
                    return Err(err(format!(
                        "expected `ROLE TOKEN [NAME]`, found {n} fields (a token or name cannot contain spaces; comments go on their own line)"
                    )));
                }
            };
            let chars = token.chars().count();
            if chars < MIN_TOKEN_CHARS {
                return Err(err(format!(
                    "the token has {chars} characters; at least {MIN_TOKEN_CHARS} are required (e.g. `openssl rand -hex 32`)"
                )));
            }
            if chars > MAX_TOKEN_CHARS {
                return Err(err(format!(
                    "the token has {chars} characters; at most {MAX_TOKEN_CHARS} are allowed"
                )));
            }
            if !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(err(
                    "the token must be printable ASCII (it is sent in an HTTP header)".into(),
                ));
            }
            let d = digest(token);
            if let Some(k) = entries.iter().position(|e| bool::from(e.digest.ct_eq(&d))) {
                return Err(err(format!(
                    "this token is already listed on line {}; give each token one role",
                    lines_of[k]
                )));
            }
            // The name is not quoted back either: a token written in its place must not leak.
            let name: Arc<str> = match name {
                Some(n) if valid_name(n) => n.into(),
                Some(_) => {
                    return Err(err(format!(
                        "the third field (the caller's name) must be at most {MAX_NAME_CHARS} ASCII letters, digits or `-_.@:`"
                    )));
                }
                None => format!("{}#{line}", role.name()).into(),
            };
            entries.push(Entry {
                digest: d,
                role,
                name,
            });
            lines_of.push(line);
        }
        if entries.is_empty() {
            return Err(TokensError::Empty {
                file: file.to_string(),
            });
        }
        Ok(TokenSet { entries })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The role of `token`, comparing its digest with every stored one in constant time.
    pub fn role_of(&self, token: &str) -> Option<Role> {
        self.identify(token).map(|(role, _)| role)
    }

    /// The role and caller name of `token` (digest compared with every entry in constant time).
    pub fn identify(&self, token: &str) -> Option<(Role, Arc<str>)> {
        let d = digest(token);
        let mut found = None;
        for e in &self.entries {
            // Every entry is compared; the digests are fixed-size, so timing says nothing of the token.
            if bool::from(e.digest.ct_eq(&d)) {
                found = Some(e);
            }
        }
        found.map(|e| (e.role, e.name.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T1: &str = "r3ad-t0ken-0123456789abcdef";
    const T2: &str = "adm1n-t0ken-0123456789abcdef";
    const T3: &str = "1ngest-t0ken-0123456789abcdef";

    #[test]
    fn parses_roles_comments_and_blank_lines() {
        let text = format!("# tokens\n\nread {T1}\n  admin\t{T2}  \n# ingest only\ningest {T3}\n");
        let set = TokenSet::parse(&text, "t.txt").unwrap();
        assert_eq!(set.len(), 3);
        assert_eq!(set.role_of(T1), Some(Role::Read));
        assert_eq!(set.role_of(T2), Some(Role::Admin));
        assert_eq!(set.role_of(T3), Some(Role::Ingest));
        assert_eq!(set.role_of("r3ad-t0ken-0123456789abcdeX"), None);
        assert_eq!(set.role_of(""), None);
    }

    #[test]
    fn names_come_from_the_third_field_or_role_and_line() {
        let text = format!("# c\nread {T1} grafana\n\ningest {T3}\nadmin {T2} ops@example.com\n");
        let set = TokenSet::parse(&text, "t").unwrap();
        let id = |t| set.identify(t).map(|(r, n)| (r, n.to_string()));
        assert_eq!(id(T1), Some((Role::Read, "grafana".into())));
        assert_eq!(id(T3), Some((Role::Ingest, "ingest#4".into())));
        assert_eq!(id(T2), Some((Role::Admin, "ops@example.com".into())));
        assert_eq!(id("nope-0123456789abcdef"), None);
    }

    #[test]
    fn role_hierarchy() {
        assert!(
            Role::Admin.grants(Role::Read)
                && Role::Admin.grants(Role::Ingest)
                && Role::Admin.grants(Role::Admin)
        );
        assert!(
            Role::Read.grants(Role::Read)
                && !Role::Read.grants(Role::Ingest)
                && !Role::Read.grants(Role::Admin)
        );
        assert!(
            Role::Ingest.grants(Role::Ingest)
                && !Role::Ingest.grants(Role::Read)
                && !Role::Ingest.grants(Role::Admin)
        );
    }

    /// Each bad line: the error names file:line and never contains the secret.
    #[test]
    fn bad_lines_name_file_and_line_without_the_token() {
        let secret = "s3cr3t-value-0123456789abcdef";
        let cases = [
            (format!("read {T1}\nreed {secret}\n"), 2, "not a role"),
            (format!("{secret} read\n"), 1, "not a role"),
            (
                format!("\n\nadmin {secret} name extra\n"),
                3,
                "found 4 fields",
            ),
            (format!("read {T1} {secret}!\n"), 1, "the caller's name"),
            (
                format!("read {T1} {}\n", "n".repeat(MAX_NAME_CHARS + 1)),
                1,
                "at most 64",
            ),
            ("read\n".to_string(), 1, "has no token"),
            ("ingest s3cr3t\n".to_string(), 1, "at least 16"),
            (
                format!("read {T1}\nadmin {T1}\n"),
                2,
                "already listed on line 1",
            ),
            (
                format!("read {}\n", "x".repeat(MAX_TOKEN_CHARS + 1)),
                1,
                "at most",
            ),
            (
                "read s3cr3t-välue-0123456789\n".to_string(),
                1,
                "printable ASCII",
            ),
        ];
        for (text, line, what) in cases {
            let err = TokenSet::parse(&text, "/etc/tw/tokens")
                .err()
                .unwrap_or_else(|| panic!("accepted {text:?}"));
            let msg = err.to_string();
            assert!(
                msg.starts_with(&format!("/etc/tw/tokens:{line}: ")),
                "{msg}"
            );
            assert!(msg.contains(what), "{msg}");
            for secret in [secret, "s3cr3t", T1, "välue"] {
                assert!(!msg.contains(secret), "error echoes a token: {msg}");
            }
        }
    }

    #[test]
    fn non_utf8_names_its_line() {
        let err = TokenSet::from_bytes(b"# x\nread abc\xff0123456789abcdef\n", "t.txt")
            .err()
            .unwrap()
            .to_string();
        assert_eq!(err, "t.txt:2: not UTF-8 text");
    }

    #[test]
    fn empty_and_missing_files_are_errors() {
        let err = TokenSet::parse("# nothing\n\n", "t.txt")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("t.txt") && err.contains("no tokens"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let err = TokenSet::load(&dir.path().join("none.txt"))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("none.txt") && err.contains("cannot read"),
            "{err}"
        );
    }
}
