// PII masking of captured text before storage: detection of e-mail addresses, phone and card
// numbers, IPv4/IPv6 addresses and national ids, each replaced by a keyed, joinable token.
//
// A match becomes `[<kind>:<16 lowercase hex>]`, the first 8 bytes of
// HMAC-SHA256(key, kind + "\0" + normalised value): the same value under the same key always gives
// the same token (captures stay joinable on it), nothing of the value can be read back from it, and
// another key gives other tokens. Values are normalised first so that the same datum written
// differently joins: e-mail lowercased; phones as `+` and digits (NANP numbers as `+1` and ten
// digits, an international trunk `(0)` dropped); cards as digits; IP addresses in the canonical
// form of `std::net`; national ids uppercased without whitespace, dashes and dots.
//
// Detection (each kind can be switched off; all are on by default):
// - e-mail: `local@domain.tld`, ASCII, at least one dot in the domain, a TLD of two or more
//   letters. Stays: `user@localhost`, `@mention`, `foo@bar`, `pkg@1.2.3`, image names like
//   `icon@2x.png` (a domain that starts with a scale factor `<n>x.`).
// - card: 13 to 19 digits, ungrouped or grouped by one kind of separator (single spaces or single
//   dashes) as cards print them (4-4-4-4…, the last group 1 to 4 digits; Amex 4-6-5; Diners 4-6-4),
//   starting with 2 to 6 (13 digits: with 4, old Visa), passing the Luhn check, and not part of a
//   longer digit or letter run or of a decimal number. Stays: a number failing Luhn, a run of 20
//   or more digits, numbers starting with 0, 1, 7, 8 or 9 (millisecond timestamps, ISBNs, order
//   numbers; this also leaves the rare 1-prefixed airline cards), other groupings (ISBN
//   `978-3-16-148410-0`, UUIDs).
// - phone: `+` then 8 to 15 digits (a trunk `(0)` not counted) with single separators (space,
//   dash, dot) and parenthesised groups, the `+` not preceded by a letter or digit (`3+4`, `1e+10`
//   stay); longer grouped runs are cut after the last group that keeps 15 digits; a `+` number
//   whose only separator is one dot is a signed decimal and stays. NANP national shapes with an
//   area code starting 2 to 9: `(555) 123-4567`, `(555)123-4567`, `555-123-4567`, `555.123.4567`,
//   optionally after `1-`, `1.`, `1 `. Stays: bare digit runs (order numbers, ids), `555 123 4567`
//   (numbers in tables look like that), seven-digit local numbers `555-1234`, dates `2026-12-03`,
//   times `12:30:45`, ISO timestamps with offsets, dashed or dotted runs with more parts.
// - IPv4: four dot-separated octets 0 to 255 without leading zeros, not preceded by a letter,
//   digit or dot and not followed by a letter, digit or `.digit`. Stays: `v1.2.3.4`, `1.2.3.4.5`,
//   `10.0.0.256`, `01.2.3.4`, semver `1.2.3`, `2.0.1-beta`. A four-part version after a space
//   (`version 1.2.3.4`) cannot be told from an address and is masked.
// - IPv6: a run of hex digits, colons and dots (an embedded IPv4 tail), bounded by characters that
//   are not letters, digits or `_` (sentence dots and one stray leading or trailing colon, as in
//   `ip:fe80::1`, are trimmed), containing `::` or 7 colons (6 with an IPv4 tail), that parses as
//   `std::net::Ipv6Addr`, with at least 2 hex digits and, unless all 8 groups are written, at least
//   one decimal digit. Stays: `std::vector`, `Foo::Bar`, `A::B`, `a::b` inside a word, `::`, `::1`,
//   `12:30:45`, MAC addresses.
// - national ids: each configured regular expression, matched on word boundaries (wrapped as
//   `\b(?:…)\b`, so a pattern should begin and end with a letter or digit). Defaults: US SSN with
//   dashes (area not 000, 666 or 9xx, group not 00, serial not 0000), UK National Insurance
//   number (valid prefix letters, spaced or not, any case), Brazilian CPF in its printed form
//   `000.000.000-00`.
//
// All kinds are searched on the same text; overlaps resolve to the earliest start, then the
// longest match (then national ids before built-in kinds), and each span is replaced once. Text
// already of the token shape of an enabled kind is left alone (so a value written in that shape,
// `[card:4111111111111111]`, stays as written). A replacement can free a neighbour that was
// refused only for touching the replaced value: a `+` number glued after one (`a@b.com+4420…`,
// chains of them) is taken in the same pass; other cases (`a@b.com::fe80`) are taken by masking
// the output again until nothing new is found, at most `MAX_PASSES` times, so masking masked text
// changes nothing and the time stays linear in the text. Two passes do in practice; only
// contrived text needs more (over `MAX_PASSES` national-format numbers glued together, as in
// `(555) 123-4567(555) 123-4568…`, leaves the rest for a later mask). Every pattern is a `regex`
// crate automaton (linear time); the hand-written checks look at each candidate once.

use hmac::{Hmac, Mac};
use regex::Regex;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::collections::{BTreeMap, HashSet};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

type HmacSha256 = Hmac<Sha256>;

/// Any token the masker writes, `[<label>:<16 lowercase hex>]`, the label its first group: for
/// readers of masked text (the log miner types these as fields).
pub const TOKEN_PATTERN: &str = r"\[([a-z0-9_]{1,32}):[0-9a-f]{16}\]";

/// Masking passes over one text at most (see the module comment).
const MAX_PASSES: usize = 8;
/// Longest national id name (it labels tokens).
const MAX_NAME_LEN: usize = 32;

/// The `capture.mask` configuration.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MaskConfig {
    /// Kinds masked; default all: email, phone, card, ipv4, ipv6, national_id.
    pub kinds: Vec<PiiKind>,
    /// National id patterns (regular expressions), by name; the name labels the tokens. Setting
    /// the list replaces the defaults (`NationalIdPattern::defaults`): US SSN, UK National
    /// Insurance number, Brazilian CPF.
    pub national_ids: Vec<NationalIdPattern>,
    /// Mask personal data in the free text of received telemetry — span names, span status
    /// messages, log bodies, tailed log lines and every string attribute whose key is not in
    /// `verbatim_attributes` — whether or not `capture.text` is on (prompt and completion
    /// attributes are dropped while it is off, masked while it is on). Default on.
    pub telemetry: bool,
    /// Attribute keys whose values are stored as sent: identifiers and enumerations of the
    /// OpenTelemetry conventions (`gen_ai.request.model`, `http.route`, `service.name` …). A
    /// trailing `*` makes a prefix (`k8s.*`). Setting the list replaces the defaults
    /// (`default_verbatim_attributes`).
    pub verbatim_attributes: Vec<String>,
}

impl Default for MaskConfig {
    fn default() -> Self {
        MaskConfig {
            kinds: PiiKind::ALL.to_vec(),
            national_ids: NationalIdPattern::defaults(),
            telemetry: true,
            verbatim_attributes: default_verbatim_attributes(),
        }
    }
}

/// Attribute keys kept verbatim by default: what the OpenTelemetry conventions (GenAI, HTTP,
/// RPC, resource, exceptions' type) and the instrumentations tokenwatch reads (OpenInference,
/// OpenLLMetry, tokenwatch's own shipped records) use for names, ids, enumerations and counts.
/// Prompt and completion attributes are content whatever this list says.
pub fn default_verbatim_attributes() -> Vec<String> {
    [
        "gen_ai.*",
        "llm.model_name",
        "llm.provider",
        "llm.system",
        "llm.token_count.*",
        "llm.invocation_parameters",
        "openinference.span.kind",
        "traceloop.span.kind",
        "traceloop.workflow.name",
        "traceloop.entity.name",
        "tokenwatch.*",
        "service.*",
        "telemetry.*",
        "otel.*",
        "event.name",
        "error.type",
        "exception.type",
        "http.request.method",
        "http.response.status_code",
        "http.route",
        "http.method",
        "http.status_code",
        "url.scheme",
        "server.address",
        "server.port",
        "network.*",
        "rpc.*",
        "db.system",
        "db.system.name",
        "db.operation.name",
        "messaging.system",
        "k8s.*",
        "container.*",
        "host.name",
        "host.arch",
        "os.*",
        "process.runtime.*",
        "deployment.environment",
        "deployment.environment.name",
        "cloud.*",
        "code.*",
        "thread.*",
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

impl MaskConfig {
    /// Checks the national id names and patterns as `Masker::new` does, without a key, and the
    /// verbatim attribute keys.
    pub fn validate(&self) -> Result<(), MaskError> {
        compile_national_ids(&self.national_ids)?;
        for (i, key) in self.verbatim_attributes.iter().enumerate() {
            let path = format!("capture.mask.verbatim_attributes[{i}]");
            let stem = key.strip_suffix('*').unwrap_or(key);
            if stem.is_empty() {
                let m = "must name a key or a key prefix (to store every attribute verbatim, \
                         set capture.mask.telemetry: false)";
                return Err(MaskError::invalid(path, m));
            }
            if stem.contains('*') || key.chars().any(char::is_whitespace) {
                let m = format!("`{key}`: a key, or a prefix ending in one `*`, without spaces");
                return Err(MaskError::invalid(path, m));
            }
        }
        Ok(())
    }
}

/// One national id shape: `name` (1 to 32 of `a-z`, `0-9`, `_`; not a built-in kind's name) and
/// a regular expression of the `regex` crate, matched on word boundaries.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NationalIdPattern {
    pub name: String,
    pub pattern: String,
}

impl NationalIdPattern {
    /// The default national id shapes, chosen for a low false-positive rate.
    pub fn defaults() -> Vec<NationalIdPattern> {
        let p = |name: &str, pattern: &str| NationalIdPattern {
            name: name.into(),
            pattern: pattern.into(),
        };
        vec![
            // AAA-GG-SSSS: area 001-899 but 666, group 01-99, serial 0001-9999.
            p(
                "us_ssn",
                r"(?:00[1-9]|0[1-9][0-9]|[1-578][0-9]{2}|6[0-57-9][0-9]|66[0-57-9])-(?:0[1-9]|[1-9][0-9])-(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})",
            ),
            // Two prefix letters (first not D F I Q U V, second not D F I O Q U V), six digits,
            // suffix A-D; printed spaced in pairs or not.
            p(
                "uk_nino",
                r"(?i:[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?[0-9]{2} ?[0-9]{2} ?[0-9]{2} ?[A-D])",
            ),
            // Cadastro de Pessoas Físicas, printed form only (bare 11 digits are too common).
            p("br_cpf", r"[0-9]{3}\.[0-9]{3}\.[0-9]{3}-[0-9]{2}"),
        ]
    }
}

/// A kind of personal data the masker recognises.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Deserialize,
    Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum PiiKind {
    Email,
    Phone,
    Card,
    Ipv4,
    Ipv6,
    NationalId,
}

impl PiiKind {
    pub const ALL: [PiiKind; 6] = [
        PiiKind::Email,
        PiiKind::Phone,
        PiiKind::Card,
        PiiKind::Ipv4,
        PiiKind::Ipv6,
        PiiKind::NationalId,
    ];

    /// The configuration name, and for the built-in kinds the token label.
    pub fn as_str(self) -> &'static str {
        match self {
            PiiKind::Email => "email",
            PiiKind::Phone => "phone",
            PiiKind::Card => "card",
            PiiKind::Ipv4 => "ipv4",
            PiiKind::Ipv6 => "ipv6",
            PiiKind::NationalId => "national_id",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MaskError {
    /// A configuration value is wrong; `path` is its key path, e.g.
    /// `capture.mask.national_ids[1].pattern`.
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    /// The masking key is empty.
    #[error("the masking key is empty")]
    EmptyKey,
}

impl MaskError {
    fn invalid(path: String, message: impl Into<String>) -> MaskError {
        MaskError::Invalid {
            path,
            message: message.into(),
        }
    }
}

/// The result of masking one text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Masked {
    /// The text with every match replaced by `[<label>:<16 lowercase hex>]`.
    pub text: String,
    /// Replacements by label (`email`, `phone`, `card`, `ipv4`, `ipv6`, or a national id
    /// pattern's name); labels without a replacement are absent.
    pub counts: BTreeMap<String, u32>,
}

impl Masked {
    /// Replacements of all labels.
    pub fn total(&self) -> u32 {
        self.counts.values().sum()
    }
}

/// The masker: built once from the configuration and the key, shared by every capture
/// (`Send + Sync`, `mask` takes `&self`).
pub struct Masker {
    mac: HmacSha256,
    email: bool,
    phone: bool,
    card: bool,
    ipv4: bool,
    ipv6: bool,
    /// Empty when national ids are not masked.
    national: Vec<National>,
    /// Tokens of the enabled labels, left alone; `None` when nothing is masked.
    protected: Option<Regex>,
    /// Only the built-in kinds and the default national ids are enabled, so `mask_free_text`
    /// may pass over text that none of them could match (`could_hold_pii`).
    needs_mark: bool,
}

struct National {
    name: String,
    re: Regex,
}

impl std::fmt::Debug for Masker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Masker")
            .field("email", &self.email)
            .field("phone", &self.phone)
            .field("card", &self.card)
            .field("ipv4", &self.ipv4)
            .field("ipv6", &self.ipv6)
            .field(
                "national_ids",
                &self.national.iter().map(|n| &n.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// The national id patterns, checked (names, regular expressions that cannot match empty text)
/// and compiled to match on word boundaries.
fn compile_national_ids(patterns: &[NationalIdPattern]) -> Result<Vec<National>, MaskError> {
    let mut national = Vec::with_capacity(patterns.len());
    let mut seen = HashSet::new();
    for (i, p) in patterns.iter().enumerate() {
        let name_path = format!("capture.mask.national_ids[{i}].name");
        let pattern_path = format!("capture.mask.national_ids[{i}].pattern");
        if p.name.is_empty() {
            return Err(MaskError::invalid(name_path, "must not be empty"));
        }
        if p.name.len() > MAX_NAME_LEN
            || !p
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(MaskError::invalid(
                name_path,
                format!(
                    "`{}`: must be 1 to {MAX_NAME_LEN} characters of a-z, 0-9 and _ \
                     (it labels the tokens, e.g. `[us_ssn:…]`)",
                    p.name
                ),
            ));
        }
        if PiiKind::ALL.iter().any(|k| k.as_str() == p.name) {
            return Err(MaskError::invalid(
                name_path,
                format!("`{}` is the name of a built-in kind", p.name),
            ));
        }
        if !seen.insert(p.name.as_str()) {
            return Err(MaskError::invalid(
                name_path,
                format!("duplicate name `{}`", p.name),
            ));
        }
        if let Err(e) = Regex::new(&p.pattern) {
            return Err(MaskError::invalid(pattern_path, e.to_string()));
        }
        let matches_empty = Regex::new(&format!("^(?:{})$", p.pattern))
            .map(|re| re.is_match(""))
            .map_err(|e| MaskError::invalid(pattern_path.clone(), e.to_string()))?;
        if matches_empty {
            return Err(MaskError::invalid(pattern_path, "matches the empty string"));
        }
        let re = Regex::new(&format!(r"\b(?:{})\b", p.pattern))
            .map_err(|e| MaskError::invalid(pattern_path, e.to_string()))?;
        national.push(National {
            name: p.name.clone(),
            re,
        });
    }
    Ok(national)
}

/// Which pattern found a candidate.
#[derive(Debug, Clone, Copy)]
enum Label {
    Kind(PiiKind),
    National(usize),
}

impl Label {
    /// Order among candidates of the same span: national ids (configured, more specific) first.
    fn priority(self) -> usize {
        match self {
            Label::National(i) => i,
            Label::Kind(k) => 1_000 + k as usize,
        }
    }
}

/// A value found in the text: byte range and normalised form.
struct Candidate {
    start: usize,
    end: usize,
    label: Label,
    norm: String,
    /// Taken only right after a replacement (its left neighbour is the end of a replaced value,
    /// which becomes `]`): what masking the text again would find.
    after_replacement: bool,
}

/// Whether `text` holds what the shortest value of some built-in kind or default national id
/// needs: `@` (e-mail), `:` (IPv6), four digits and three dots (IPv4), or six digits (a phone
/// has eight or more, a card thirteen, an SSN nine, a NINO six, a CPF eleven).
fn could_hold_pii(text: &str) -> bool {
    let (mut digits, mut dots) = (0usize, 0usize);
    for b in text.bytes() {
        match b {
            b'@' | b':' => return true,
            b'0'..=b'9' => digits += 1,
            b'.' => dots += 1,
            _ => {}
        }
    }
    digits >= 6 || (digits >= 4 && dots >= 3)
}

fn compile(pattern: &str) -> Regex {
    // The built-in patterns are constants of this file, exercised by every test that builds a
    // masker.
    Regex::new(pattern).expect("built-in masking pattern compiles")
}

static EMAIL: LazyLock<Regex> = LazyLock::new(|| {
    compile(r"[A-Za-z0-9._%+\-]+@(?:[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?\.)+[A-Za-z]{2,}\b")
});
static PHONE_INTL: LazyLock<Regex> =
    LazyLock::new(|| compile(r"\+[0-9]+(?:(?:[ .\-]|[ .\-]?\([0-9]{1,4}\)[ .\-]?)[0-9]+)*"));
static PHONE_NANP: LazyLock<Regex> = LazyLock::new(|| {
    compile(concat!(
        r"(?:^|[^\w.+\-])(",
        r"(?:1 ?)?\([0-9]{3}\) ?[0-9]{3}[ .\-][0-9]{4}",
        r"|(?:1[ \-])?[0-9]{3}-[0-9]{3}-[0-9]{4}",
        r"|(?:1[ .])?[0-9]{3}\.[0-9]{3}\.[0-9]{4}",
        r")"
    ))
});
/// Maximal runs of digit groups separated by one space or dash.
static CARD_RUN: LazyLock<Regex> = LazyLock::new(|| compile(r"[0-9]+(?:[ \-][0-9]+)*"));
/// Maximal dotted digit runs.
static IPV4_RUN: LazyLock<Regex> = LazyLock::new(|| compile(r"[0-9]+(?:\.[0-9]+)+"));
/// Maximal runs of hex digits, dots and colons that hold a colon.
static IPV6_RUN: LazyLock<Regex> = LazyLock::new(|| compile(r"[0-9A-Fa-f.]*:[0-9A-Fa-f.:]*"));

impl Masker {
    /// The masker for `cfg`, keyed with `key`. The key is what makes tokens irreversible: keep
    /// it secret and make it random, 16 bytes or more (small value spaces such as phone numbers
    /// could otherwise be enumerated back from their tokens); an empty key is refused.
    pub fn new(cfg: &MaskConfig, key: &[u8]) -> Result<Masker, MaskError> {
        if key.is_empty() {
            return Err(MaskError::EmptyKey);
        }
        let mac = HmacSha256::new_from_slice(key).map_err(|_| MaskError::EmptyKey)?;
        let on = |k: PiiKind| cfg.kinds.contains(&k);
        let mut national = compile_national_ids(&cfg.national_ids)?;
        if !on(PiiKind::NationalId) {
            national.clear();
        }

        let mut labels: Vec<String> = PiiKind::ALL
            .iter()
            .filter(|&&k| k != PiiKind::NationalId && on(k))
            .map(|k| k.as_str().to_owned())
            .collect();
        labels.extend(national.iter().map(|n| regex::escape(&n.name)));
        let protected = if labels.is_empty() {
            None
        } else {
            let re = Regex::new(&format!(r"\[(?:{}):[0-9a-f]{{16}}\]", labels.join("|"))).map_err(
                |e| MaskError::invalid("capture.mask.national_ids".into(), e.to_string()),
            )?;
            Some(re)
        };

        let needs_mark =
            !on(PiiKind::NationalId) || cfg.national_ids == NationalIdPattern::defaults();
        Ok(Masker {
            needs_mark,
            mac,
            email: on(PiiKind::Email),
            phone: on(PiiKind::Phone),
            card: on(PiiKind::Card),
            ipv4: on(PiiKind::Ipv4),
            ipv6: on(PiiKind::Ipv6),
            national,
            protected,
        })
    }

    /// The text with every match replaced by `[<label>:<16 lowercase hex>]` (label: `email`,
    /// `phone`, `card`, `ipv4`, `ipv6`, or the national id pattern's name), and how many of each
    /// label were replaced.
    pub fn mask(&self, text: &str) -> Masked {
        let mut counts = BTreeMap::new();
        let mut current: Option<String> = None;
        for _ in 0..MAX_PASSES {
            let src = current.as_deref().unwrap_or(text);
            match self.pass(src, &mut counts) {
                Some(next) => current = Some(next),
                None => break,
            }
        }
        Masked {
            text: current.unwrap_or_else(|| text.to_owned()),
            counts,
        }
    }

    /// Free text of received telemetry (a span name, an attribute value, a log line): the text
    /// masked, or None when nothing in it is personal data. Text that no built-in kind or default
    /// national id could match (`could_hold_pii`: most names and messages, `chat llama-3-8b`) is
    /// not scanned, so the common case costs one pass over the bytes.
    pub fn mask_free_text(&self, text: &str) -> Option<String> {
        if self.needs_mark && !could_hold_pii(text) {
            return None;
        }
        let m = self.mask(text);
        (m.total() > 0).then_some(m.text)
    }

    fn label(&self, label: Label) -> &str {
        match label {
            Label::Kind(k) => k.as_str(),
            Label::National(i) => &self.national[i].name,
        }
    }

    /// 16 lowercase hex: the first 8 bytes of HMAC-SHA256(key, label "\0" normalised value).
    fn token(&self, label: &str, norm: &str) -> String {
        let mut mac = self.mac.clone();
        mac.update(label.as_bytes());
        mac.update(&[0]);
        mac.update(norm.as_bytes());
        let digest = mac.finalize().into_bytes();
        hex::encode(&digest[..8])
    }

    /// One pass over `text`: the masked text, or `None` when nothing was found.
    fn pass(&self, text: &str, counts: &mut BTreeMap<String, u32>) -> Option<String> {
        let mut cands = Vec::new();
        if self.email {
            find_emails(text, &mut cands);
        }
        if self.phone {
            find_intl_phones(text, &mut cands);
            find_nanp_phones(text, &mut cands);
        }
        if self.card {
            find_cards(text, &mut cands);
        }
        if self.ipv4 {
            find_ipv4(text, &mut cands);
        }
        if self.ipv6 {
            find_ipv6(text, &mut cands);
        }
        for (i, n) in self.national.iter().enumerate() {
            for m in n.re.find_iter(text) {
                if m.is_empty() {
                    continue;
                }
                let norm = m
                    .as_str()
                    .chars()
                    .filter(|c| !c.is_whitespace() && *c != '-' && *c != '.')
                    .flat_map(char::to_uppercase)
                    .collect();
                cands.push(Candidate {
                    start: m.start(),
                    end: m.end(),
                    label: Label::National(i),
                    norm,
                    after_replacement: false,
                });
            }
        }
        if cands.is_empty() {
            return None;
        }
        let protected: Vec<(usize, usize)> = match &self.protected {
            Some(re) => re.find_iter(text).map(|m| (m.start(), m.end())).collect(),
            None => Vec::new(),
        };
        cands.sort_by(|a, b| {
            a.start
                .cmp(&b.start)
                .then(b.end.cmp(&a.end))
                .then(a.label.priority().cmp(&b.label.priority()))
        });

        let mut out = String::with_capacity(text.len() + 16);
        let mut pos = 0;
        let mut replaced = false;
        for c in cands {
            if c.start < pos
                || c.start >= c.end
                || (c.after_replacement && !(replaced && c.start == pos))
                || overlaps(&protected, c.start, c.end)
            {
                continue;
            }
            let label = self.label(c.label);
            out.push_str(&text[pos..c.start]);
            out.push('[');
            out.push_str(label);
            out.push(':');
            out.push_str(&self.token(label, &c.norm));
            out.push(']');
            *counts.entry(label.to_owned()).or_insert(0) += 1;
            pos = c.end;
            replaced = true;
        }
        if !replaced {
            return None;
        }
        out.push_str(&text[pos..]);
        Some(out)
    }
}

/// Whether `[start, end)` overlaps one of the sorted, disjoint `spans`.
fn overlaps(spans: &[(usize, usize)], start: usize, end: usize) -> bool {
    let i = spans.partition_point(|&(_, e)| e <= start);
    spans.get(i).is_some_and(|&(s, _)| s < end)
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The character before byte `i` (a char boundary), and the one before that.
fn before(text: &str, i: usize) -> Option<char> {
    text[..i].chars().next_back()
}
fn before2(text: &str, i: usize) -> Option<char> {
    text[..i].chars().rev().nth(1)
}
/// The character at byte `i` (a char boundary), and the one after it.
fn after(text: &str, i: usize) -> Option<char> {
    text[i..].chars().next()
}
fn after2(text: &str, i: usize) -> Option<char> {
    text[i..].chars().nth(1)
}

fn is_digit(c: Option<char>) -> bool {
    c.is_some_and(|c| c.is_ascii_digit())
}

fn find_emails(text: &str, out: &mut Vec<Candidate>) {
    for m in EMAIL.find_iter(text) {
        let s = m.as_str();
        let Some((_, domain)) = s.split_once('@') else {
            continue;
        };
        if is_scale_suffix(domain) {
            continue;
        }
        out.push(Candidate {
            start: m.start(),
            end: m.end(),
            label: Label::Kind(PiiKind::Email),
            norm: s.to_ascii_lowercase(),
            after_replacement: false,
        });
    }
}

/// `2x.png`, `1.5x.png`: an image name's scale suffix, not a mail domain.
fn is_scale_suffix(domain: &str) -> bool {
    let d = domain.as_bytes();
    let digits = |from: usize| d[from..].iter().take_while(|b| b.is_ascii_digit()).count();
    let mut i = digits(0);
    if i == 0 {
        return false;
    }
    if d.get(i) == Some(&b'.') {
        let frac = digits(i + 1);
        if frac > 0 {
            i += 1 + frac;
        }
    }
    matches!(d.get(i), Some(b'x' | b'X')) && d.get(i + 1) == Some(&b'.')
}

fn find_intl_phones(text: &str, out: &mut Vec<Candidate>) {
    for m in PHONE_INTL.find_iter(text) {
        let prev = before(text, m.start());
        if prev == Some('+') {
            continue;
        }
        let Some((len, norm)) = intl_phone(m.as_str()) else {
            continue;
        };
        let end = m.start() + len;
        // Cut after a group: what follows is a separator. Whole: the run ended there.
        if len == m.len() && after(text, end).is_some_and(is_word) {
            continue;
        }
        out.push(Candidate {
            start: m.start(),
            end,
            label: Label::Kind(PiiKind::Phone),
            norm,
            // Glued to a word (`3+4…`, `1e+10`) it is no phone, unless that word is a value
            // replaced just before (`a@b.com+4420…`).
            after_replacement: prev.is_some_and(is_word),
        });
    }
}

/// For a `PHONE_INTL` match (`+`, digits, separators, parenthesised groups): the length of the
/// phone number in it and its normalised form, or `None` when it is none.
fn intl_phone(s: &str) -> Option<(usize, String)> {
    let b = s.as_bytes();
    let mut digits = String::from("+");
    // (byte end, digits so far) after each digit group outside parentheses.
    let mut cuts: Vec<(usize, usize)> = Vec::new();
    let mut i = 1;
    while i < b.len() {
        match b[i] {
            b'(' => {
                let close = i + b[i..].iter().position(|&c| c == b')')?;
                let inner = &s[i + 1..close];
                // A trunk prefix `(0)` is not dialled from abroad.
                if inner != "0" {
                    digits.push_str(inner);
                }
                i = close + 1;
                if i >= b.len() || !b[i].is_ascii_digit() {
                    cuts.push((i, digits.len() - 1));
                }
            }
            c if c.is_ascii_digit() => {
                digits.push(c as char);
                i += 1;
                if i >= b.len() || !b[i].is_ascii_digit() {
                    cuts.push((i, digits.len() - 1));
                }
            }
            _ => i += 1,
        }
    }
    let &(end, count) = cuts.iter().rev().find(|&&(_, n)| n <= 15)?;
    if count < 8 {
        return None;
    }
    let num = &s[..end];
    let dots = num.bytes().filter(|&c| c == b'.').count();
    if dots == 1 && !num.bytes().any(|c| matches!(c, b' ' | b'-' | b'(')) {
        return None; // a signed decimal, `+1234.5678`
    }
    digits.truncate(count + 1);
    Some((end, digits))
}

fn find_nanp_phones(text: &str, out: &mut Vec<Candidate>) {
    for caps in PHONE_NANP.captures_iter(text) {
        let Some(m) = caps.get(1) else { continue };
        let end = m.end();
        let next = after(text, end);
        if next.is_some_and(is_word)
            || (matches!(next, Some('-' | '.')) && is_digit(after2(text, end)))
        {
            continue;
        }
        let digits: String = m.as_str().chars().filter(char::is_ascii_digit).collect();
        let national = &digits[digits.len() - 10..];
        if !matches!(national.as_bytes()[0], b'2'..=b'9') {
            continue;
        }
        out.push(Candidate {
            start: m.start(),
            end,
            label: Label::Kind(PiiKind::Phone),
            norm: format!("+1{national}"),
            after_replacement: false,
        });
    }
}

fn find_cards(text: &str, out: &mut Vec<Candidate>) {
    for m in CARD_RUN.find_iter(text) {
        let s = m.as_str().as_bytes();
        // Digit groups (byte ranges within the run) and the separator after each but the last.
        let mut groups: Vec<(usize, usize)> = Vec::new();
        let mut seps: Vec<u8> = Vec::new();
        let mut start = 0;
        for (i, &c) in s.iter().enumerate() {
            if !c.is_ascii_digit() {
                groups.push((start, i));
                seps.push(c);
                start = i + 1;
            }
        }
        groups.push((start, s.len()));
        if groups.iter().map(|(a, b)| b - a).sum::<usize>() < 13 {
            continue;
        }
        // Not glued to a word, and not the fraction or integer part of a decimal number.
        let left_ok = !(before(text, m.start()).is_some_and(is_word)
            || (before(text, m.start()) == Some('.') && is_digit(before2(text, m.start()))));
        let right_ok = !(after(text, m.end()).is_some_and(is_word)
            || (after(text, m.end()) == Some('.') && is_digit(after2(text, m.end()))));

        let n = groups.len();
        let mut i = if left_ok { 0 } else { 1 };
        while i < n {
            let mut best: Option<(usize, String)> = None;
            let mut digits = String::new();
            for j in i..n {
                if j > i && seps[j - 1] != seps[i] {
                    break;
                }
                let (a, b) = groups[j];
                digits.extend(s[a..b].iter().map(|&c| char::from(c)));
                if digits.len() > 19 {
                    break;
                }
                if digits.len() < 13 || (j == n - 1 && !right_ok) {
                    continue;
                }
                let sizes: Vec<usize> = groups[i..=j].iter().map(|(a, b)| b - a).collect();
                if card_layout(&sizes) && card_number(&digits) {
                    best = Some((j, digits.clone()));
                }
            }
            match best {
                Some((j, digits)) => {
                    out.push(Candidate {
                        start: m.start() + groups[i].0,
                        end: m.start() + groups[j].1,
                        label: Label::Kind(PiiKind::Card),
                        norm: digits,
                        after_replacement: false,
                    });
                    i = j + 1;
                }
                None => i += 1,
            }
        }
    }
}

/// Group sizes as cards print them: one group; 4-4-…-4 with a last group of 1 to 4; 4-6-5; 4-6-4.
fn card_layout(sizes: &[usize]) -> bool {
    match sizes {
        [_] => true,
        [4, 6, 5] | [4, 6, 4] => true,
        [4, middle @ .., last] => middle.iter().all(|&g| g == 4) && (1..=4).contains(last),
        _ => false,
    }
}

/// 13 to 19 digits of a payment card: issuer digit 2 to 6 (13 digits: 4), Luhn check passing.
fn card_number(digits: &str) -> bool {
    let first = digits.as_bytes()[0];
    (13..=19).contains(&digits.len())
        && matches!(first, b'2'..=b'6')
        && (digits.len() != 13 || first == b'4')
        && luhn(digits)
}

/// The Luhn check of a string of ASCII digits.
fn luhn(digits: &str) -> bool {
    let mut sum = 0u32;
    for (i, c) in digits.bytes().rev().enumerate() {
        let mut d = u32::from(c.wrapping_sub(b'0'));
        if d > 9 {
            return false;
        }
        if i % 2 == 1 {
            d *= 2;
            if d > 9 {
                d -= 9;
            }
        }
        sum += d;
    }
    !digits.is_empty() && sum.is_multiple_of(10)
}

fn find_ipv4(text: &str, out: &mut Vec<Candidate>) {
    for m in IPV4_RUN.find_iter(text) {
        let prev = before(text, m.start());
        if prev.is_some_and(|c| c.is_alphanumeric() || c == '.') {
            continue;
        }
        let next = after(text, m.end());
        if next.is_some_and(char::is_alphanumeric)
            || (next == Some('.') && is_digit(after2(text, m.end())))
        {
            continue;
        }
        let s = m.as_str();
        let parts: Vec<&str> = s.split('.').collect();
        let octet = |p: &&str| {
            p.len() <= 3
                && (p.len() == 1 || !p.starts_with('0'))
                && p.parse::<u16>().is_ok_and(|v| v <= 255)
        };
        if parts.len() != 4 || !parts.iter().all(octet) {
            continue;
        }
        let Ok(addr) = s.parse::<Ipv4Addr>() else {
            continue;
        };
        out.push(Candidate {
            start: m.start(),
            end: m.end(),
            label: Label::Kind(PiiKind::Ipv4),
            norm: addr.to_string(),
            after_replacement: false,
        });
    }
}

fn find_ipv6(text: &str, out: &mut Vec<Candidate>) {
    let b = text.as_bytes();
    for m in IPV6_RUN.find_iter(text) {
        let (mut s, mut e) = (m.start(), m.end());
        while s < e && b[s] == b'.' {
            s += 1;
        }
        while e > s && b[e - 1] == b'.' {
            e -= 1;
        }
        if e - s >= 2 && b[s] == b':' && b[s + 1] != b':' {
            s += 1;
        }
        if e - s >= 2 && b[e - 1] == b':' && b[e - 2] != b':' {
            e -= 1;
        }
        if before(text, s).is_some_and(is_word) || after(text, e).is_some_and(is_word) {
            continue;
        }
        let cand = &text[s..e];
        let colons = cand.bytes().filter(|&c| c == b':').count();
        if !(cand.contains("::") || colons == 7 || (colons == 6 && cand.contains('.'))) {
            continue;
        }
        if cand.bytes().filter(u8::is_ascii_hexdigit).count() < 2
            || (colons != 7 && !cand.bytes().any(|c| c.is_ascii_digit()))
        {
            continue;
        }
        let Ok(addr) = cand.parse::<Ipv6Addr>() else {
            continue;
        };
        out.push(Candidate {
            start: s,
            end: e,
            label: Label::Kind(PiiKind::Ipv6),
            norm: addr.to_string(),
            after_replacement: false,
        });
    }
}

#[cfg(test)]
#[path = "mask_tests.rs"]
mod tests;
