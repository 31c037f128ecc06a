// Masking before template mining: every whitespace token whose core is a variable (number,
// hex, UUID, id, path, IP, duration, percentage, timestamp) becomes a typed field `<KIND>`, and so
// does each token that replaced personal data before mining (`[email:9f8e…]`, capture::mask):
// `<IP>` for addresses (with a port glued on, as an address with a port would be), `<PII>` else.

use regex::Regex;
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};
use std::sync::LazyLock;

/// Tokens mined per line at most; the rest of a longer line is left out.
pub const MAX_TOKENS: usize = 200;
/// Longest token kept as a field example (longer ones are cut).
const MAX_VALUE_CHARS: usize = 120;

/// What a masked field held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FieldKind {
    Num,
    Hex,
    Uuid,
    Id,
    Path,
    Ip,
    Duration,
    Percent,
    Timestamp,
    /// Personal data replaced by a keyed token before mining (e-mail, phone, card, national id).
    Pii,
}

impl FieldKind {
    /// The placeholder that stands for the field in a template.
    pub fn placeholder(self) -> &'static str {
        match self {
            FieldKind::Num => "<NUM>",
            FieldKind::Hex => "<HEX>",
            FieldKind::Uuid => "<UUID>",
            FieldKind::Id => "<ID>",
            FieldKind::Path => "<PATH>",
            FieldKind::Ip => "<IP>",
            FieldKind::Duration => "<DUR>",
            FieldKind::Percent => "<PCT>",
            FieldKind::Timestamp => "<TS>",
            FieldKind::Pii => "<PII>",
        }
    }
}

/// A line as the miner sees it: tokens with variables replaced, and the variables in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Masked {
    pub tokens: Vec<String>,
    pub fields: Vec<(FieldKind, String)>,
}

const LEADING: &[char] = &['(', '[', '{', '"', '\'', '<', '`'];
const TRAILING: &[char] = &[
    ')', ']', '}', '"', '\'', ',', ';', ':', '.', '!', '?', '>', '`',
];

/// Mask `text` token by token (at most `MAX_TOKENS`).
pub fn mask(text: &str) -> Masked {
    let mut out = Masked::default();
    for raw in text.split_whitespace().take(MAX_TOKENS) {
        out.tokens.push(mask_token(raw, &mut out.fields));
    }
    out
}

/// A token of `capture::mask` (`[<label>:<16 lowercase hex>]`), with a port glued on.
static PII_TOKEN: LazyLock<Regex> = LazyLock::new(|| {
    // A constant pattern, exercised by the unit tests below.
    let pattern = format!(r"{}(:[0-9]{{1,5}}\b)?", crate::capture::mask::TOKEN_PATTERN);
    Regex::new(&pattern).expect("pattern compiles")
});

fn mask_token(raw: &str, fields: &mut Vec<(FieldKind, String)>) -> String {
    if raw.contains('[') && PII_TOKEN.is_match(raw) {
        // Each masked value is a field; the text around it is masked as a token of its own.
        let mut out = String::with_capacity(raw.len());
        let mut pos = 0;
        for m in PII_TOKEN.captures_iter(raw) {
            let (Some(all), Some(label)) = (m.get(0), m.get(1)) else {
                continue;
            };
            if all.start() > pos {
                out.push_str(&mask_plain_token(&raw[pos..all.start()], fields));
            }
            let kind = match label.as_str() {
                "ipv4" | "ipv6" => FieldKind::Ip,
                _ => FieldKind::Pii,
            };
            fields.push((kind, all.as_str().to_string()));
            out.push_str(kind.placeholder());
            pos = all.end();
        }
        if pos < raw.len() {
            out.push_str(&mask_plain_token(&raw[pos..], fields));
        }
        return out;
    }
    mask_plain_token(raw, fields)
}

fn mask_plain_token(raw: &str, fields: &mut Vec<(FieldKind, String)>) -> String {
    let start = raw.len() - raw.trim_start_matches(LEADING).len();
    let (prefix, rest) = raw.split_at(start);
    let core = rest.trim_end_matches(TRAILING);
    // A trailing '.' or ':' may belong to the value only for none of the kinds; a '%' stays.
    let suffix = &rest[core.len()..];
    if core.is_empty() {
        return raw.to_string();
    }
    if let Some(kind) = classify(core) {
        fields.push((kind, clip(core)));
        return format!("{prefix}{}{suffix}", kind.placeholder());
    }
    // `key=value`, `file.py:123`, `a,b`: mask the parts.
    if core.contains(['=', ':', ',']) {
        let mut rebuilt = String::with_capacity(core.len());
        let mut masked_any = false;
        let mut part_start = 0;
        for (i, c) in core.char_indices() {
            if matches!(c, '=' | ':' | ',') {
                masked_any |= push_part(&core[part_start..i], &mut rebuilt, fields);
                rebuilt.push(c);
                part_start = i + c.len_utf8();
            }
        }
        masked_any |= push_part(&core[part_start..], &mut rebuilt, fields);
        if masked_any {
            return format!("{prefix}{rebuilt}{suffix}");
        }
    }
    raw.to_string()
}

fn push_part(part: &str, out: &mut String, fields: &mut Vec<(FieldKind, String)>) -> bool {
    match classify(part) {
        Some(kind) => {
            fields.push((kind, clip(part)));
            out.push_str(kind.placeholder());
            true
        }
        None => {
            out.push_str(part);
            false
        }
    }
}

fn clip(s: &str) -> String {
    match s.char_indices().nth(MAX_VALUE_CHARS) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// The kind of variable `s` is, or None for a constant.
pub fn classify(s: &str) -> Option<FieldKind> {
    if s.is_empty() {
        return None;
    }
    if is_uuid(s) {
        return Some(FieldKind::Uuid);
    }
    if is_timestamp(s) {
        return Some(FieldKind::Timestamp);
    }
    if is_ip(s) {
        return Some(FieldKind::Ip);
    }
    if let Some((num, unit)) = split_number(s) {
        if unit.is_empty() {
            return Some(FieldKind::Num);
        }
        if unit == "%" {
            return Some(FieldKind::Percent);
        }
        if is_duration_unit(unit) {
            return Some(FieldKind::Duration);
        }
        // Sizes and counts with a unit glued on: `2GiB`, `512MB`, `1.5k`, `4x`.
        if !num.is_empty() && unit.len() <= 4 && unit.chars().all(|c| c.is_ascii_alphabetic()) {
            return Some(FieldKind::Num);
        }
    }
    if is_hex(s) {
        return Some(FieldKind::Hex);
    }
    if is_path(s) {
        return Some(FieldKind::Path);
    }
    if is_id(s) {
        return Some(FieldKind::Id);
    }
    None
}

/// `-12`, `1.5e-3`, `+3`: the numeric prefix and what follows it.
fn split_number(s: &str) -> Option<(&str, &str)> {
    let b = s.as_bytes();
    let mut i = 0;
    if matches!(b.first(), Some(b'-' | b'+')) {
        i = 1;
    }
    let digits_start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    let int_digits = i - digits_start;
    let mut frac_digits = 0;
    if i < b.len() && b[i] == b'.' && i + 1 < b.len() && b[i + 1].is_ascii_digit() {
        i += 1;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
            frac_digits += 1;
        }
    }
    if int_digits + frac_digits == 0 {
        return None;
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        let mut j = i + 1;
        if j < b.len() && (b[j] == b'-' || b[j] == b'+') {
            j += 1;
        }
        let exp_start = j;
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        if j > exp_start {
            i = j;
        }
    }
    Some((&s[..i], &s[i..]))
}

fn is_duration_unit(u: &str) -> bool {
    matches!(
        u,
        "ns" | "us"
            | "µs"
            | "ms"
            | "s"
            | "sec"
            | "secs"
            | "m"
            | "min"
            | "mins"
            | "h"
            | "hr"
            | "hrs"
            | "d"
    )
}

fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

fn all_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit())
}

/// Dates and times: `2024-12-03`, `12-03`, `2024/12/03`, `10:00:01`, `10:00:01.123`,
/// `10:00:01,123`, `2024-12-03T10:00:01Z`, `2024-12-03T10:00:01.5+00:00`.
fn is_timestamp(s: &str) -> bool {
    let (date, time) = match s.split_once('T') {
        Some((d, t)) if is_date(d) => (Some(d), Some(t)),
        Some(_) => return false,
        None if is_date(s) => (Some(s), None),
        None => (None, Some(s)),
    };
    if date.is_some() && time.is_none() {
        return true;
    }
    let Some(t) = time else { return false };
    let t = t.trim_end_matches('Z');
    // Strip a `+00:00` / `-05:00` zone after a full time.
    let t = match t.rfind(['+', '-']) {
        Some(i) if i >= 8 => &t[..i],
        _ => t,
    };
    let (hms, frac) = match t.split_once(['.', ',']) {
        Some((a, f)) => (a, Some(f)),
        None => (t, None),
    };
    let parts: Vec<&str> = hms.split(':').collect();
    (parts.len() == 3 || (parts.len() == 2 && date.is_some()))
        && parts
            .iter()
            .all(|p| (1..=2).contains(&p.len()) && all_digits(p))
        && frac.is_none_or(all_digits)
}

fn is_date(s: &str) -> bool {
    let parts: Vec<&str> = s.split(['-', '/']).collect();
    match parts.as_slice() {
        [y, m, d] => {
            y.len() == 4 && m.len() == 2 && d.len() == 2 && parts.iter().all(|p| all_digits(p))
        }
        // vLLM's `MM-DD`.
        [m, d] => m.len() == 2 && d.len() == 2 && s.contains('-') && all_digits(m) && all_digits(d),
        _ => false,
    }
}

fn is_ip(s: &str) -> bool {
    if s.parse::<SocketAddr>().is_ok() {
        return true;
    }
    match s.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) => s.bytes().filter(|c| *c == b'.').count() == 3,
        Ok(IpAddr::V6(_)) => s.contains(':'),
        Err(_) => false,
    }
}

/// `0x1f`, or a run of at least 8 hex digits with a digit in it (ids, hashes, addresses).
fn is_hex(s: &str) -> bool {
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return !h.is_empty() && h.bytes().all(|c| c.is_ascii_hexdigit());
    }
    s.len() >= 8
        && s.bytes().all(|c| c.is_ascii_hexdigit())
        && s.bytes().any(|c| c.is_ascii_digit())
}

fn is_path(s: &str) -> bool {
    let unix =
        (s.starts_with('/') || s.starts_with("./") || s.starts_with("../") || s.starts_with("~/"))
            && s.len() > 1
            && !s.contains("//");
    let windows = s.len() > 3 && s.as_bytes()[1] == b':' && s.as_bytes()[2] == b'\\';
    unix || windows
}

/// Letters and digits mixed (request ids, `chatcmpl-…`, `EngineCore_0`, model revisions): at
/// least two digits, or one digit in a token of 8 or more characters.
fn is_id(s: &str) -> bool {
    let ok_chars = s
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    let digits = s.bytes().filter(|c| c.is_ascii_digit()).count();
    let letters = s.bytes().any(|c| c.is_ascii_alphabetic());
    ok_chars && letters && digits > 0 && (digits >= 2 || s.len() >= 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> String {
        mask(s).tokens.join(" ")
    }

    #[test]
    fn personal_data_tokens_are_fields() {
        // Lines masked for personal data (capture::mask) before mining: each token is a field,
        // so two addresses give one template and no address reaches an example.
        let a = mask("login from [ipv4:0a1b2c3d4e5f6071]:51234 user=[email:9f8e7d6c5b4a3921], ok");
        let b = mask("login from [ipv4:1b2c3d4e5f607182]:443 user=[email:8e7d6c5b4a3921ab], ok");
        assert_eq!(a.tokens, b.tokens);
        assert_eq!(a.tokens.join(" "), "login from <IP> user=<PII>, ok");
        assert_eq!(
            a.fields,
            vec![
                (FieldKind::Ip, "[ipv4:0a1b2c3d4e5f6071]:51234".to_string()),
                (FieldKind::Pii, "[email:9f8e7d6c5b4a3921]".to_string()),
            ]
        );
        let c = mask("(card=[card:00112233445566aa]) [phone:0011223344556677][x] 12");
        assert_eq!(c.tokens.join(" "), "(card=<PII>) <PII>[x] <NUM>");
        // Not a token: brackets around other text stay as they were.
        assert_eq!(
            mask("[metrics.py:345]").tokens.join(" "),
            "[metrics.py:<NUM>]"
        );
    }

    #[test]
    fn kinds_are_recognised() {
        for (s, k) in [
            ("42", FieldKind::Num),
            ("-1.5e-3", FieldKind::Num),
            ("2GiB", FieldKind::Num),
            ("12.5s", FieldKind::Duration),
            ("340ms", FieldKind::Duration),
            ("43.1%", FieldKind::Percent),
            ("0x7f3a", FieldKind::Hex),
            ("4bf92f3577b34da6", FieldKind::Hex),
            ("123e4567-e89b-12d3-a456-426614174000", FieldKind::Uuid),
            ("chatcmpl-8f3a2b9c1d", FieldKind::Id),
            (
                "/usr/lib/python3.12/site-packages/torch/nn/modules/module.py",
                FieldKind::Path,
            ),
            ("127.0.0.1:50012", FieldKind::Ip),
            ("10.0.0.7", FieldKind::Ip),
            ("::1", FieldKind::Ip),
            ("12-03", FieldKind::Timestamp),
            ("10:00:01", FieldKind::Timestamp),
            ("10:00:01,123", FieldKind::Timestamp),
            ("2024-12-03T10:00:01.5Z", FieldKind::Timestamp),
            ("2024-12-03", FieldKind::Timestamp),
        ] {
            assert_eq!(classify(s), Some(k), "{s}");
        }
        for s in [
            "INFO",
            "tokens/s",
            "HTTP/1.1",
            "throughput",
            "v1",
            "CUDA",
            "utf-8",
            "torch.OutOfMemoryError",
            "deadbeef",
        ] {
            assert_eq!(classify(s), None, "{s}");
        }
    }

    #[test]
    fn vllm_lines_keep_constants_and_type_variables() {
        let line = "INFO 12-03 10:00:01 [metrics.py:455] Avg prompt throughput: 1203.4 tokens/s, Avg generation throughput: 512.1 tokens/s, Running: 12 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 43.1%, CPU KV cache usage: 0.0%.";
        assert_eq!(
            m(line),
            "INFO <TS> <TS> [metrics.py:<NUM>] Avg prompt throughput: <NUM> tokens/s, Avg generation throughput: <NUM> tokens/s, Running: <NUM> reqs, Swapped: <NUM> reqs, Pending: <NUM> reqs, GPU KV cache usage: <PCT>, CPU KV cache usage: <PCT>."
        );
        let masked = mask(line);
        assert_eq!(masked.fields[0], (FieldKind::Timestamp, "12-03".into()));
        assert!(
            masked
                .fields
                .contains(&(FieldKind::Percent, "43.1%".into()))
        );
        assert_eq!(
            m(r#"INFO:     127.0.0.1:50012 - "POST /v1/chat/completions HTTP/1.1" 200 OK"#),
            r#"INFO: <IP> - "POST <PATH> HTTP/1.1" <NUM> OK"#
        );
        assert_eq!(
            m("(EngineCore_0 pid=4711) took 12.5s, then 340ms"),
            "(<ID> pid=<NUM>) took <DUR>, then <DUR>"
        );
        assert_eq!(
            m("Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB"),
            "Tried to allocate <NUM> GiB. GPU <NUM> has a total capacity of <NUM> GiB"
        );
    }

    #[test]
    fn long_lines_are_cut_and_values_clipped() {
        let line = "x ".repeat(MAX_TOKENS + 50);
        assert_eq!(mask(&line).tokens.len(), MAX_TOKENS);
        let long = format!("/{}", "a".repeat(500));
        let f = mask(&long).fields;
        assert_eq!(f[0].0, FieldKind::Path);
        assert!(f[0].1.chars().count() <= MAX_VALUE_CHARS + 1);
    }
}
