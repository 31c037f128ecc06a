// Compact SQLite form of span attributes: each well-known `"key":` of the JSON object becomes
// one control byte (lossless; a BLOB, so rows written before it, TEXT, still read as they are).

//! The proxy writes a span row for every proxied request; its attributes JSON is ~70% key text
//! (`"gen_ai.usage.output_tokens":` and the like). Stored as they come, those bytes are written
//! to the WAL, checkpointed into the database and copied by the kernel twice per row. The
//! compact form replaces every occurrence of `"<key>":`, for the keys of [`KEYS`], by the byte
//! `1 + index`: valid JSON never holds a raw byte below 0x20 (JSON escapes them), so the codes
//! cannot clash with the text and decoding is the exact inverse. A text that does hold such a
//! byte is stored as it is (TEXT). The form is told apart by SQLite's storage class: TEXT is the
//! JSON as given, BLOB the compact form.

/// Keys with a one-byte code: code `1 + index`. Append-only (stored rows name keys by index):
/// never reorder or remove an entry; at most 31 (codes 0x01..=0x1f).
const KEYS: &[&str] = &[
    // The proxy's span (pipeline/proxy_span.rs), in the order it writes them.
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "gen_ai.response.model",
    "gen_ai.request.stream",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.reasoning.output_tokens",
    "gen_ai.response.finish_reasons",
    "gen_ai.response.time_to_first_chunk",
    "server.address",
    "server.port",
    "http.request.method",
    "url.path",
    "http.response.status_code",
    "error.type",
    "tokenwatch.request_id",
    "tokenwatch.tenant",
    "tokenwatch.ab_group",
    "tokenwatch.model_version",
    // Other GenAI span attributes received over OTLP.
    "gen_ai.system",
    "gen_ai.request.max_tokens",
    "gen_ai.request.temperature",
    "gen_ai.request.top_p",
    "gen_ai.response.id",
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.conversation.id",
];

const _: () = assert!(KEYS.len() <= 31, "codes are the bytes 0x01..=0x1f");

/// The code of `key`, when it has one.
fn code_of(key: &[u8]) -> Option<u8> {
    // ≤31 short keys, filtered by length and first byte before comparing: cheaper than hashing.
    let first = *key.first()?;
    KEYS.iter()
        .position(|k| k.len() == key.len() && k.as_bytes()[0] == first && k.as_bytes() == key)
        .map(|i| i as u8 + 1)
}

/// The index of the first `"` in `b` at or after `from`: eight bytes per step (a zero byte of
/// `word ^ 0x22..22` marks a quote; the lowest marked byte is always a real one).
fn find_quote(b: &[u8], mut from: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    while let Some(chunk) = b.get(from..from + 8) {
        let Ok(bytes) = <[u8; 8]>::try_from(chunk) else {
            break;
        };
        let x = u64::from_le_bytes(bytes) ^ (ONES * u64::from(b'"'));
        let zero = x.wrapping_sub(ONES) & !x & HIGHS;
        if zero != 0 {
            return Some(from + (zero.trailing_zeros() / 8) as usize);
        }
        from += 8;
    }
    b.get(from..)?
        .iter()
        .position(|&c| c == b'"')
        .map(|off| from + off)
}

/// The compact form of `json`, or None when `json` holds a byte below 0x20 (then it is stored
/// as it is).
pub(crate) fn encode(json: &str) -> Option<Vec<u8>> {
    let b = json.as_bytes();
    // A fold without early exit: compiled to SIMD compares, several times faster here than
    // `any` (the text is a few hundred bytes).
    if b.iter().fold(false, |seen, &c| seen | (c < 0x20)) {
        return None;
    }
    let mut out = Vec::with_capacity(b.len());
    // `b[..copied]` is in `out`; the text between replaced keys is copied a run at a time.
    // Quotes are found 8 bytes at a time (`find_quote`): the quoted strings are short, so a
    // call per search to a SIMD search costs more than it saves, and a byte loop is slow.
    let mut copied = 0;
    let mut i = 0;
    while let Some(open) = find_quote(b, i) {
        // `"` at `open`: a key when the next `"` is followed by `:` and the text between is
        // known.
        let Some(close) = find_quote(b, open + 1) else {
            break;
        };
        if b.get(close + 1) == Some(&b':')
            && let Some(code) = code_of(&b[open + 1..close])
        {
            out.extend_from_slice(&b[copied..open]);
            out.push(code);
            copied = close + 2;
            i = copied;
        } else {
            // Not a known key: its closing quote may open the next string.
            i = close;
        }
    }
    out.extend_from_slice(&b[copied..]);
    Some(out)
}

/// The JSON a compact form stands for; Err names what is wrong with a damaged blob.
pub(crate) fn decode(blob: &[u8]) -> Result<String, String> {
    let mut out = Vec::with_capacity(blob.len() * 2 + 64);
    for &c in blob {
        if c >= 0x20 {
            out.push(c);
            continue;
        }
        let key = c
            .checked_sub(1)
            .and_then(|i| KEYS.get(usize::from(i)))
            .ok_or_else(|| format!("compact span attributes hold an unknown key code {c:#04x}"))?;
        out.push(b'"');
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(b"\":");
    }
    String::from_utf8(out).map_err(|e| format!("compact span attributes are not UTF-8: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(json: &str) -> Vec<u8> {
        let blob = encode(json).expect("no control bytes");
        assert_eq!(decode(&blob).unwrap(), json, "{json:?}");
        blob
    }

    #[test]
    fn known_keys_shrink_to_one_byte_and_come_back() {
        let json = r#"{"gen_ai.operation.name":"chat","gen_ai.provider.name":"vllm","gen_ai.request.model":"llama","gen_ai.request.stream":true,"gen_ai.usage.input_tokens":12,"gen_ai.response.finish_reasons":["stop"],"server.port":8000,"tokenwatch.request_id":"req-1"}"#;
        let blob = round_trip(json);
        assert_eq!(
            blob,
            b"{\x01\"chat\",\x02\"vllm\",\x03\"llama\",\x05true,\x0612,\x09[\"stop\"],\x0c8000,\x11\"req-1\"}"
        );
        assert!(blob.len() * 2 < json.len());
    }

    #[test]
    fn unknown_keys_values_that_look_like_keys_and_odd_text_are_kept() {
        for json in [
            "",
            "{}",
            r#"{"custom.key":"gen_ai.request.model","x":1}"#,
            // A known key as a value, followed by a colon inside the next string.
            r#"{"a":"gen_ai.request.model",":":"server.port"}"#,
            r#"{"a":["gen_ai.request.model",":"]}"#,
            // An escaped quote right before a known key name inside a value.
            r#"{"a":"x\"gen_ai.request.model\":1"}"#,
            r#"{"gen_ai.request.model" :"spaced"}"#,
            r#"{"gen_ai.request.model":"ünïcødé ✓","tokenwatch.tenant":"🦀"}"#,
            r#"{"unterminated"#,
            r#"""""":"":"gen_ai.system":"#,
            "not json at all",
        ] {
            round_trip(json);
        }
    }

    #[test]
    fn every_mix_of_quotes_colons_and_key_fragments_round_trips() {
        // Every string of up to 5 tokens from pieces chosen to straddle key boundaries.
        let pieces = [
            "\"",
            ":",
            "gen_ai.system",
            "\\",
            "x",
            "url.path",
            "\":",
            "é",
        ];
        let mut texts = vec![String::new()];
        for _ in 0..5 {
            let mut next = Vec::new();
            for t in &texts {
                for p in pieces {
                    next.push(format!("{t}{p}"));
                }
            }
            texts = next;
            for t in &texts {
                round_trip(t);
            }
        }
    }

    #[test]
    fn the_word_at_a_time_search_finds_the_first_quote() {
        // Quotes at every offset of 0..40, after bytes that borrow in the word trick
        // (0x21, 0x23, 0xa2, 0x00-adjacent values) and in multi-byte UTF-8.
        for fill in [b'a', 0x21, 0x23, 0xa2, 0xff, 0x01] {
            for len in 0..40 {
                for q in 0..=len {
                    let mut b = vec![fill; len];
                    if q < len {
                        b[q] = b'"';
                    }
                    for from in 0..=len + 1 {
                        let naive = b
                            .get(from..)
                            .and_then(|r| r.iter().position(|&c| c == b'"'))
                            .map(|o| from + o);
                        assert_eq!(find_quote(&b, from), naive, "{b:?} from {from}");
                    }
                }
            }
        }
    }

    #[test]
    fn text_with_control_bytes_is_not_compacted() {
        assert_eq!(encode("{\"a\":\"tab\there\"}"), None);
        assert_eq!(encode("\u{1}"), None);
    }

    #[test]
    fn damaged_blobs_are_errors() {
        let err = decode(b"{\x1f\"x\"}").unwrap_err();
        assert!(err.contains("0x1f"), "{err}");
        assert!(decode(b"{\x00}").is_err());
        assert!(decode(&[b'"', 0xff, b'"']).unwrap_err().contains("UTF-8"));
    }

    #[test]
    fn every_key_has_its_own_code() {
        for (i, k) in KEYS.iter().enumerate() {
            assert_eq!(code_of(k.as_bytes()), Some(i as u8 + 1), "{k}");
            assert!(k.bytes().all(|c| c >= 0x20 && c != b'"' && c != b'\\'));
        }
    }
}
