// Refused attempts folded in the audit log (issue 35 item 10): a client hammering the API
// without a token (401), with the wrong role or from a foreign page (403) writes its first
// refusal of each minute whole, and the rest of that minute as one `requests_refused` line with
// a count, so the log grows by a bounded number of lines a minute however many requests are
// refused. At most `MAX_KEYS` (client address, caller, status, method and path) are told apart
// per minute; refusals beyond them are folded together under the address `other`, whatever
// their method and path.

use super::entry::{RefusedSummary, RequestEntry};
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long refusals of one key are folded into one line.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Keys told apart within one window; the rest share the address `other`.
pub const MAX_KEYS: usize = 64;

/// What a refusal is folded under: the client's address, the caller, the status, the method and
/// path (address and request None: the keys beyond `MAX_KEYS`, together).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    remote: Option<IpAddr>,
    caller: Arc<str>,
    status: u16,
    request: Option<(String, String)>,
}

/// The refusals of one key in the current window not written whole.
#[derive(Debug, Clone)]
struct Folded {
    count: u64,
    first: Option<DateTime<Utc>>,
    last: Option<DateTime<Utc>>,
}

/// The writer thread's table of this window's refusals.
pub struct Refusals {
    keys: HashMap<Key, Folded>,
    window_started: Instant,
}

impl Default for Refusals {
    fn default() -> Self {
        Refusals {
            keys: HashMap::new(),
            window_started: Instant::now(),
        }
    }
}

/// Whether a request entry is a refused attempt (no token, an unknown one, a wrong role, a
/// foreign page).
pub fn is_refusal(entry: &RequestEntry) -> bool {
    matches!(entry.status, 401 | 403)
}

impl Refusals {
    /// Whether `entry` (a refusal) is written whole: the first of its key in this window.
    /// Otherwise it is counted, to be written in the window's summary.
    pub fn admit(&mut self, entry: &RequestEntry) -> bool {
        let mut key = Key {
            remote: entry.remote.map(|a| a.ip()),
            caller: entry.caller.clone(),
            status: entry.status,
            request: Some((entry.method.clone(), entry.path.clone())),
        };
        if !self.keys.contains_key(&key) && self.keys.len() >= MAX_KEYS {
            (key.remote, key.request) = (None, None);
        }
        match self.keys.get_mut(&key) {
            None => {
                self.keys.insert(
                    key,
                    Folded {
                        count: 0,
                        first: None,
                        last: None,
                    },
                );
                true
            }
            Some(f) => {
                f.count += 1;
                f.first.get_or_insert(entry.ts);
                f.last = Some(entry.ts);
                false
            }
        }
    }

    /// Whether the window is over (`now`): its summaries are due.
    pub fn due(&self, now: Instant) -> bool {
        !self.keys.is_empty() && now.duration_since(self.window_started) >= WINDOW
    }

    /// The window's summaries (keys with refusals not written whole), stamped `ts`, in a stable
    /// order; a new window starts.
    pub fn take(&mut self, ts: DateTime<Utc>) -> Vec<RefusedSummary> {
        self.window_started = Instant::now();
        let mut out: Vec<RefusedSummary> = self
            .keys
            .drain()
            .filter(|(_, f)| f.count > 0)
            .map(|(k, f)| RefusedSummary {
                ts,
                remote: k.remote,
                caller: k.caller,
                status: k.status,
                request: k.request,
                count: f.count,
                first: f.first.unwrap_or(ts),
                last: f.last.unwrap_or(ts),
            })
            .collect();
        out.sort_by(|a, b| {
            let order = |s: &RefusedSummary| {
                (
                    s.remote.is_none(),
                    s.remote,
                    s.caller.clone(),
                    s.status,
                    s.request.clone(),
                )
            };
            order(a).cmp(&order(b))
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(ip: &str, caller: &str, status: u16, ms: i64) -> RequestEntry {
        RequestEntry {
            ts: DateTime::from_timestamp_millis(1_700_000_000_000 + ms).unwrap(),
            caller: caller.into(),
            role: None,
            remote: Some(format!("{ip}:5555").parse().unwrap()),
            method: "GET".into(),
            path: "/api/v1/fleet".into(),
            query: None,
            status,
            bytes: 0,
            duration_ms: 0.1,
        }
    }

    #[test]
    fn the_first_refusal_of_a_key_is_written_and_the_rest_of_the_window_counted() {
        let mut r = Refusals::default();
        assert!(r.admit(&refused("10.0.0.1", "anonymous", 401, 0)));
        for i in 1..=4999 {
            assert!(!r.admit(&refused("10.0.0.1", "anonymous", 401, i)));
        }
        // Another address, caller, status or path is another key.
        assert!(r.admit(&refused("10.0.0.2", "anonymous", 401, 1)));
        let mut reload = refused("10.0.0.1", "anonymous", 401, 4);
        (reload.method, reload.path) = ("POST".into(), "/-/reload".into());
        assert!(r.admit(&reload));
        assert!(r.admit(&refused("10.0.0.1", "unknown-token", 401, 2)));
        assert!(r.admit(&refused("10.0.0.1", "anonymous", 403, 3)));
        assert!(!r.due(Instant::now()), "the window is not over");
        assert!(r.due(Instant::now() + WINDOW));
        let now = DateTime::from_timestamp_millis(1_700_000_060_000).unwrap();
        let s = r.take(now);
        assert_eq!(s.len(), 1, "only keys with refusals not written: {s:?}");
        assert_eq!(s[0].count, 4999);
        assert_eq!(s[0].remote, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(s[0].request, Some(("GET".into(), "/api/v1/fleet".into())));
        assert_eq!(s[0].first.timestamp_millis(), 1_700_000_000_001);
        assert_eq!(s[0].last.timestamp_millis(), 1_700_000_004_999);
        // A new window: the first refusal is written whole again.
        assert!(r.admit(&refused("10.0.0.1", "anonymous", 401, 70_000)));
        assert!(r.take(now).is_empty());
    }

    #[test]
    fn addresses_beyond_the_cap_share_other() {
        let mut r = Refusals::default();
        let mut written = 0;
        for i in 0..10_000u32 {
            let ip = std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string();
            let mut e = refused(&ip, "anonymous", 401, i64::from(i));
            e.path = format!("/scan/{i}");
            written += usize::from(r.admit(&e));
        }
        // MAX_KEYS addresses, then one `other` line: the rest counted under it.
        assert_eq!(written, MAX_KEYS + 1);
        let s = r.take(Utc::now());
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!((s[0].remote, &s[0].request), (None, &None));
        assert_eq!(s[0].count, 10_000 - MAX_KEYS as u64 - 1);
    }
}
