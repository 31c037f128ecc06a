// Who and what a proxied request is: request id, W3C trace context, and the tenant
// (configured header, else a salted hash of the API key — the key itself is never kept).

use http::HeaderMap;
use rand::Rng;
use sha2::{Digest, Sha256};

pub fn new_request_id() -> String {
    let bytes: [u8; 16] = rand::rng().random();
    hex::encode(bytes)
}

/// A new span id: 16 lowercase hex digits, never all zero.
pub fn new_span_id() -> String {
    let mut bytes: [u8; 8] = rand::rng().random();
    bytes[0] |= 1;
    hex::encode(bytes)
}

/// A parsed `traceparent` header (version 00).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: String,
    pub parent_id: String,
    pub flags: String,
}

impl TraceParent {
    /// Parse `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`; all-zero ids are invalid.
    pub fn parse(value: &str) -> Option<TraceParent> {
        let mut parts = value.trim().split('-');
        let (version, trace, parent, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let lower_hex = |s: &str, n: usize| {
            s.len() == n
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if version != "00" || parts.next().is_some() {
            return None;
        }
        if !lower_hex(trace, 32) || !lower_hex(parent, 16) || !lower_hex(flags, 2) {
            return None;
        }
        if trace.bytes().all(|b| b == b'0') || parent.bytes().all(|b| b == b'0') {
            return None;
        }
        Some(TraceParent {
            trace_id: trace.into(),
            parent_id: parent.into(),
            flags: flags.into(),
        })
    }

    /// A new sampled trace context.
    pub fn generate() -> TraceParent {
        let mut rng = rand::rng();
        let trace: [u8; 16] = rng.random();
        let mut parent: [u8; 8] = rng.random();
        parent[0] |= 1; // never all zero
        let mut trace = trace;
        trace[0] |= 1;
        TraceParent {
            trace_id: hex::encode(trace),
            parent_id: hex::encode(parent),
            flags: "01".into(),
        }
    }

    /// The context to send on to the next hop when this one came from the caller: the same
    /// trace and flags with a new span id (the proxy's own span) as the parent. Returns it with
    /// the caller's span id, the parent of the proxy's span.
    pub fn child(self) -> (TraceParent, String) {
        let TraceParent {
            trace_id,
            parent_id,
            flags,
        } = self;
        (
            TraceParent {
                trace_id,
                parent_id: new_span_id(),
                flags,
            },
            parent_id,
        )
    }

    pub fn header_value(&self) -> String {
        format!("00-{}-{}-{}", self.trace_id, self.parent_id, self.flags)
    }
}

/// The tenant of a request: the configured header when present, else `key-<16 hex>` from a
/// salted SHA-256 of the API key — the bearer token, Azure OpenAI's `api-key` or Anthropic's
/// `x-api-key` (one key gives one tenant whichever header carries it) — else `anonymous`.
pub fn tenant_of(headers: &HeaderMap, tenant_header: &str, salt: &[u8]) -> String {
    if let Some(v) = headers.get(tenant_header).and_then(|v| v.to_str().ok()) {
        let v = v.trim();
        if !v.is_empty() {
            return v.chars().take(128).collect();
        }
    }
    let key = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim())
        .map(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
                .unwrap_or(v)
                .trim()
        })
        .or_else(|| headers.get("api-key").and_then(|v| v.to_str().ok()))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()));
    match key {
        Some(k) if !k.is_empty() => {
            let mut h = Sha256::new();
            h.update(salt);
            h.update(k.as_bytes());
            let digest = h.finalize();
            format!("key-{}", hex::encode(&digest[..8]))
        }
        _ => "anonymous".into(),
    }
}

/// A header's value as a label (trimmed, bounded), or empty.
pub fn header_label(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().chars().take(128).collect())
        .unwrap_or_default()
}

/// Load the tenant salt from the data directory, creating it on first use.
pub fn load_or_create_salt(data_dir: &std::path::Path) -> std::io::Result<Vec<u8>> {
    load_or_create_secret(data_dir, "tenant-salt")
}

/// A random 32-byte secret (64 hex digits) kept in `data_dir/name`, created on first use and
/// readable by its owner only.
pub fn load_or_create_secret(data_dir: &std::path::Path, name: &str) -> std::io::Result<Vec<u8>> {
    let path = data_dir.join(name);
    match std::fs::read(&path) {
        Ok(s) if !s.is_empty() => Ok(s),
        _ => {
            let secret: [u8; 32] = rand::rng().random();
            let text = hex::encode(secret);
            std::fs::create_dir_all(data_dir)?;
            std::fs::write(&path, &text)?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            }
            Ok(text.into_bytes())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trip_and_rejects() {
        let v = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let tp = TraceParent::parse(v).unwrap();
        assert_eq!(tp.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(tp.header_value(), v);
        assert!(
            TraceParent::parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none()
        );
        assert!(
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").is_none()
        );
        assert!(
            TraceParent::parse("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01").is_none()
        );
        assert!(TraceParent::parse("garbage").is_none());
        let g = TraceParent::generate();
        assert_eq!(TraceParent::parse(&g.header_value()), Some(g));
        let (child, caller) = tp.clone().child();
        assert_eq!(caller, "00f067aa0ba902b7");
        assert_eq!(
            (child.trace_id.as_str(), child.flags.as_str()),
            (tp.trace_id.as_str(), "01")
        );
        assert_ne!(child.parent_id, caller);
        assert_eq!(TraceParent::parse(&child.header_value()), Some(child));
    }

    #[test]
    fn tenant_from_header_or_hashed_key() {
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer sk-secret".parse().unwrap());
        let t1 = tenant_of(&h, "x-tenant-id", b"salt");
        assert!(t1.starts_with("key-") && t1.len() == 20, "{t1}");
        assert!(!t1.contains("secret"));
        assert_eq!(t1, tenant_of(&h, "x-tenant-id", b"salt"));
        assert_ne!(t1, tenant_of(&h, "x-tenant-id", b"other"));
        h.insert("x-tenant-id", "acme".parse().unwrap());
        assert_eq!(tenant_of(&h, "x-tenant-id", b"salt"), "acme");
        assert_eq!(
            tenant_of(&HeaderMap::new(), "x-tenant-id", b"salt"),
            "anonymous"
        );
        // The same key under Azure's `api-key` or Anthropic's `x-api-key` is the same tenant.
        for name in ["api-key", "x-api-key"] {
            let mut h = HeaderMap::new();
            h.insert(name, "sk-secret".parse().unwrap());
            assert_eq!(tenant_of(&h, "x-tenant-id", b"salt"), t1, "{name}");
        }
    }
}
