// Tests of PII masking: a corpus of PII shapes and of near-misses that must stay, token
// joinability and keying, configuration errors, and a property test of stability on any text.

use super::*;
use proptest::prelude::*;

const KEY: &[u8] = b"test-key-0123456789abcdef";
const OTHER_KEY: &[u8] = b"another-key-0123456789abcdef";

/// The default masker, built once (building compiles the patterns).
fn masker() -> &'static Masker {
    static MASKER: LazyLock<Masker> =
        LazyLock::new(|| Masker::new(&MaskConfig::default(), KEY).unwrap());
    &MASKER
}

static TOKEN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\[([a-z0-9_]+):([0-9a-f]{16})\]$").unwrap());
static ANY_TOKEN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\[([a-z0-9_]+):([0-9a-f]{16})\]").unwrap());

/// The tokens in `text`, as (label, hex).
fn tokens(text: &str) -> Vec<(String, String)> {
    ANY_TOKEN
        .captures_iter(text)
        .map(|c| (c[1].to_owned(), c[2].to_owned()))
        .collect()
}

/// `value` (which occurs once in `text`) comes out as one token of `label`, the rest unchanged;
/// returns the token's hex.
fn assert_masked(m: &Masker, text: &str, value: &str, label: &str) -> String {
    let pos = text
        .find(value)
        .unwrap_or_else(|| panic!("{value:?} not in {text:?}"));
    let (prefix, suffix) = (&text[..pos], &text[pos + value.len()..]);
    let out = m.mask(text);
    assert!(
        out.text.starts_with(prefix) && out.text.ends_with(suffix),
        "{text:?} ({label} {value:?}) → {:?}",
        out.text
    );
    let middle = &out.text[prefix.len()..out.text.len() - suffix.len()];
    let caps = TOKEN
        .captures(middle)
        .unwrap_or_else(|| panic!("{text:?}: {value:?} not masked as {label}: {:?}", out.text));
    assert_eq!(&caps[1], label, "{text:?} → {:?}", out.text);
    assert_eq!(
        out.counts,
        BTreeMap::from([(label.to_owned(), 1)]),
        "{text:?} → {:?}",
        out.text
    );
    caps[2].to_owned()
}

/// Each value in the positions a text puts it: alone, in a sentence, at start and end, next to
/// punctuation.
fn placements(value: &str) -> Vec<String> {
    vec![
        value.to_owned(),
        format!("Please contact {value} tomorrow."),
        format!("{value} is the one"),
        format!("the value was {value}"),
        format!("the value was {value}."),
        format!("({value}), then"),
        format!("\"{value}\";"),
        format!("x:\n{value}\n"),
        format!("é {value} ü"),
    ]
}

const EMAILS: &[&str] = &[
    "jane.doe@example.com",
    "JOHN+tag@Mail.Example.co.uk",
    "a_b-c%d@sub.domain.org",
    "x@y.io",
    "first.last@xn--bcher-kva.ch",
];
const PHONES: &[&str] = &[
    "+1 (555) 123-4567",
    "+44 20 7946 0958",
    "+44 (0)20 7946 0958",
    "+33 1 23 45 67 89",
    "+49-30-1234567",
    "+15551234567",
    "+81.3.1234.5678",
    "(555) 123-4567",
    "(555)123-4567",
    "555-123-4567",
    "555.123.4567",
    "1-800-555-0199",
];
const CARDS: &[&str] = &[
    "4111 1111 1111 1111",
    "4111-1111-1111-1111",
    "4111111111111111",
    "5555555555554444",
    "5555 5555 5555 4444",
    "3782 822463 10005",
    "378282246310005",
    "6011111111111117",
    "4222222222222",
    "2223003122003222",
    "4012888888881881",
];
const IPV4S: &[&str] = &[
    "192.168.1.1",
    "10.0.0.255",
    "8.8.8.8",
    "255.255.255.255",
    "0.0.0.0",
    "172.16.254.3",
];
const IPV6S: &[&str] = &[
    "2001:db8::1",
    "fe80::1ff:fe23:4567:890a",
    "2001:0db8:0000:0000:0000:ff00:0042:8329",
    "::ffff:192.0.2.128",
    "FE80::ABCD:1",
    "2001:db8:85a3::8a2e:370:7334",
];
const NATIONAL_IDS: &[(&str, &str)] = &[
    ("123-45-6789", "us_ssn"),
    ("078-05-1120", "us_ssn"),
    ("AB123456C", "uk_nino"),
    ("AB 12 34 56 C", "uk_nino"),
    ("ce123456a", "uk_nino"),
    ("123.456.789-09", "br_cpf"),
];

#[test]
fn corpus_values_are_what_the_test_claims() {
    for card in CARDS {
        let digits: String = card.chars().filter(char::is_ascii_digit).collect();
        assert!(luhn(&digits), "{card} fails Luhn");
    }
    for not_card in ["1234567812345678", "4111111111111112", "5555555555554445"] {
        assert!(!luhn(not_card), "{not_card} passes Luhn");
    }
    assert!(luhn("79927398713") && !luhn("79927398710") && !luhn(""));
}

#[test]
fn pii_corpus_is_masked_with_its_kind() {
    let m = masker();
    let kinds = [
        (EMAILS, "email"),
        (PHONES, "phone"),
        (CARDS, "card"),
        (IPV4S, "ipv4"),
        (IPV6S, "ipv6"),
    ];
    for (values, label) in kinds {
        for value in values {
            for text in placements(value) {
                assert_masked(m, &text, value, label);
            }
        }
    }
    for (value, label) in NATIONAL_IDS {
        for text in placements(value) {
            assert_masked(m, &text, value, label);
        }
    }
}

#[test]
fn pii_in_structured_text_is_masked() {
    let m = masker();
    assert_masked(m, "mailto:jane@example.com", "jane@example.com", "email");
    assert_masked(m, "<jane@example.com>", "jane@example.com", "email");
    assert_masked(m, r#"{"ip":"10.1.2.3"}"#, "10.1.2.3", "ipv4");
    assert_masked(m, "http://10.1.2.3:8080/x", "10.1.2.3", "ipv4");
    assert_masked(m, "net 10.0.0.0/8", "10.0.0.0", "ipv4");
    assert_masked(m, "Server at 10.1.2.3.", "10.1.2.3", "ipv4");
    assert_masked(m, "https://[2001:db8::1]:443/", "2001:db8::1", "ipv6");
    assert_masked(m, "ip:fe80::1ff:fe23", "fe80::1ff:fe23", "ipv6");
    assert_masked(m, "link fe80::1%eth0 up", "fe80::1", "ipv6");
    assert_masked(m, "addr 2001:db8::1: up", "2001:db8::1", "ipv6");
    assert_masked(
        m,
        "card=4111111111111111&exp=12/29",
        "4111111111111111",
        "card",
    );
    assert_masked(
        m,
        "card 4111 1111 1111 1111 cvv",
        "4111 1111 1111 1111",
        "card",
    );
    assert_masked(m, "tel:+15551234567", "+15551234567", "phone");
    assert_masked(m, "call +1-555-123-4567 ext", "+1-555-123-4567", "phone");
    assert_masked(m, "SSN: 123-45-6789.", "123-45-6789", "us_ssn");
}

#[test]
fn several_kinds_in_one_text() {
    let m = masker();
    let text = "Mail jane@example.com or call +44 20 7946 0958 from 10.0.0.1; \
                card 4111 1111 1111 1111, SSN 123-45-6789, host 2001:db8::1.";
    let out = m.mask(text);
    let expected: BTreeMap<String, u32> = ["email", "phone", "ipv4", "card", "us_ssn", "ipv6"]
        .into_iter()
        .map(|k| (k.to_owned(), 1))
        .collect();
    assert_eq!(out.counts, expected, "{}", out.text);
    assert_eq!(out.total(), 6);
    for value in ["jane", "7946", "10.0.0.1", "4111", "6789", "db8"] {
        assert!(!out.text.contains(value), "{value} left in {}", out.text);
    }
    let labels: Vec<String> = tokens(&out.text).into_iter().map(|(l, _)| l).collect();
    assert_eq!(labels, ["email", "phone", "ipv4", "card", "us_ssn", "ipv6"]);
    assert!(out.text.starts_with("Mail [email:"), "{}", out.text);
    assert!(out.text.ends_with("]."), "{}", out.text);
}

#[test]
fn adjacent_values_are_all_masked() {
    let m = masker();
    for text in [
        "jane@example.com+15551234567",
        "+15551234567+15559876543+15550001111",
        "fe80::1:jane@example.com",
        "555-123-4567-4111-1111-1111-1111",
        "10.1.2.3.123.456.789-09",
    ] {
        let out = m.mask(text);
        assert!(out.total() >= 2, "{text:?} → {:?}", out.text);
        assert_eq!(m.mask(&out.text).text, out.text, "{text:?}");
    }
    // Glued `+` numbers are taken in one pass, however many (more than the passes allowed).
    let chain = format!("jane@example.com{}", "+15551234567".repeat(3 * MAX_PASSES));
    let out = m.mask(&chain);
    assert_eq!(out.counts["phone"], 3 * MAX_PASSES as u32, "{}", out.text);
    assert_eq!(out.counts["email"], 1);
    assert!(!out.text.contains('+'), "{}", out.text);
    assert_eq!(m.mask(&out.text).text, out.text);
    // One glued to a word that is not replaced stays.
    assert_eq!(m.mask("x+15551234567").text, "x+15551234567");
}

#[test]
fn near_misses_stay() {
    let m = masker();
    let near_misses = [
        // e-mail-like
        "user@localhost",
        "ping @mention please",
        "foo@bar",
        "icon@2x.png and logo@1.5x.png",
        "npm i react@18.2.0",
        "docker pull img@sha256:abc",
        // card-like
        "1234567812345678",
        "4111111111111112",
        "4111 1111 1111 1112",
        "order 5555555555554445",
        "ISBN 978-3-16-148410-0",
        "ISBN 9783161484100",
        "ts 1733212345678 ms",
        "41111111111111111111",
        "id a4111111111111111b",
        "pi 0.4111111111111111",
        "x 0.30000000000000004",
        "9111111111111111",
        "4111 1111 1111 11",
        // phone-like
        "order 5551234567 shipped",
        "555 123 4567",
        "call 555-1234",
        "+12345",
        "3+4=7 and 12+123456789",
        "1e+10",
        "delta +1234.5678",
        "(123) 456-7890",
        "555-123-4567-89",
        // dates, times, timestamps
        "2026-12-03",
        "on 2026-12-03 at 12:30:45",
        "2026-12-03T12:30:45Z",
        "2026-12-03T12:30:45.123+01:00",
        "20261203T123045",
        // versions and IPv4-like
        "1.2.3",
        "version 1.2.3",
        "v1.2.3.4",
        "V1.2.3.4",
        "v10.0.0.1",
        "1.2.3.4.5",
        "10.0.0.256",
        "01.2.3.4",
        "2.0.1-beta",
        "python3.11.4.1",
        // IPv6-like
        "std::vector<int>",
        "Foo::Bar",
        "A::B and Cafe::Bee",
        "xa::by",
        "::",
        "::1",
        "at 12:30:45",
        "mac 00:1a:2b:3c:4d:5e",
        "Self::default() and fmt::Debug",
        // ids and URLs
        "trace 4bf92f3577b34da6a3ce929d0e0e4736",
        "uuid 123e4567-e89b-12d3-a456-426614174000",
        "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "https://example.com/path?q=1&r=2#frag",
        "https://api.openai.com/v1/chat/completions",
        "http://localhost:8080/",
        "git checkout 1a2b3c4d",
        // national-id-like
        "000-12-3456",
        "666-12-3456",
        "900-12-3456",
        "123-00-4567",
        "123-45-0000",
        "x123-45-6789",
        "QQ123456C",
        "AB123456E",
        "123.456.789",
        // plain text
        "",
        "Hello, world! Nothing to see here.",
        "Numbers: 1, 22, 333, 4444, 55555.",
        "Ünïcödé ✓ 𝄞 text",
    ];
    for text in near_misses {
        let out = m.mask(text);
        assert_eq!(out.text, text, "{text:?} changed");
        assert!(out.counts.is_empty(), "{text:?}: {:?}", out.counts);
    }
}

#[test]
fn equal_values_give_equal_tokens() {
    let m = masker();
    let a = assert_masked(m, "mail jane@example.com now", "jane@example.com", "email");
    let b = assert_masked(m, "(Jane@Example.COM)", "Jane@Example.COM", "email");
    assert_eq!(a, b, "e-mail case must not matter");

    let phones = [
        "(555) 123-4567",
        "555-123-4567",
        "555.123.4567",
        "+1 555 123 4567",
        "+1 (555) 123-4567",
        "1-555-123-4567",
        "+15551234567",
    ];
    let phone_tokens: Vec<String> = phones
        .iter()
        .map(|p| assert_masked(m, &format!("tel {p}"), p, "phone"))
        .collect();
    assert!(
        phone_tokens.iter().all(|t| *t == phone_tokens[0]),
        "{phone_tokens:?}"
    );
    let uk = assert_masked(m, "+44 20 7946 0958", "+44 20 7946 0958", "phone");
    let uk_trunk = assert_masked(m, "+44 (0)20 7946 0958", "+44 (0)20 7946 0958", "phone");
    assert_eq!(uk, uk_trunk);
    assert_ne!(uk, phone_tokens[0]);

    let cards = [
        "4111 1111 1111 1111",
        "4111-1111-1111-1111",
        "4111111111111111",
    ];
    let card_tokens: Vec<String> = cards
        .iter()
        .map(|c| assert_masked(m, c, c, "card"))
        .collect();
    assert!(
        card_tokens.iter().all(|t| *t == card_tokens[0]),
        "{card_tokens:?}"
    );

    let v6a = assert_masked(m, "2001:0DB8:0:0::1", "2001:0DB8:0:0::1", "ipv6");
    let v6b = assert_masked(m, "2001:db8::1", "2001:db8::1", "ipv6");
    assert_eq!(v6a, v6b);

    let ni_a = assert_masked(m, "AB 12 34 56 C", "AB 12 34 56 C", "uk_nino");
    let ni_b = assert_masked(m, "ab123456c", "ab123456c", "uk_nino");
    assert_eq!(ni_a, ni_b);

    // The same value in two texts joins; different values differ.
    let t1 = tokens(&m.mask("from 10.0.0.1 to 10.0.0.2").text);
    let t2 = tokens(&m.mask("again 10.0.0.1, later").text);
    assert_eq!(t1.len(), 2);
    assert_ne!(t1[0], t1[1]);
    assert_eq!(t2, vec![t1[0].clone()]);
}

#[test]
fn tokens_are_the_keyed_hash_of_the_normalised_value() {
    let m = masker();
    let hex = assert_masked(m, "555.123.4567", "555.123.4567", "phone");
    let mut mac = HmacSha256::new_from_slice(KEY).unwrap();
    mac.update(b"phone\0+15555551234");
    let other = hex::encode(&mac.finalize().into_bytes()[..8]);
    assert_ne!(hex, other);
    let mut mac = HmacSha256::new_from_slice(KEY).unwrap();
    mac.update(b"phone\0+15551234567");
    assert_eq!(hex, hex::encode(&mac.finalize().into_bytes()[..8]));
    // Kinds are separated: the same digits as a card and as a national id hash differently.
    assert_ne!(m.token("card", "123"), m.token("us_ssn", "123"));
}

#[test]
fn another_key_gives_other_tokens_and_values_never_leak() {
    let a = masker();
    let b = Masker::new(&MaskConfig::default(), OTHER_KEY).unwrap();
    let text = "jane@example.com +44 20 7946 0958 4111111111111111 10.0.0.1 2001:db8::1 \
                123-45-6789";
    let (ma, mb) = (a.mask(text), b.mask(text));
    assert_eq!(ma.counts, mb.counts);
    assert_eq!(ma.total(), 6);
    assert_ne!(ma.text, mb.text);
    let (ta, tb) = (tokens(&ma.text), tokens(&mb.text));
    assert_eq!(ta.len(), 6);
    for (x, y) in ta.iter().zip(&tb) {
        assert_eq!(x.0, y.0);
        assert_ne!(x.1, y.1);
    }
    for value in [
        "jane", "example", "7946", "0958", "4111", "10.0.0.1", "db8", "6789",
    ] {
        assert!(!ma.text.contains(value), "{value} in {}", ma.text);
        assert!(!mb.text.contains(value), "{value} in {}", mb.text);
    }
}

#[test]
fn masked_text_is_stable() {
    let m = masker();
    let text = "jane@example.com, +1 (555) 123-4567, 4111 1111 1111 1111, 10.0.0.1, fe80::1ff, \
                AB123456C";
    let once = m.mask(text);
    let twice = m.mask(&once.text);
    assert_eq!(twice.text, once.text);
    assert!(twice.counts.is_empty());
    // A token whose hex happens to be all digits and Luhn-valid is still left alone.
    let fake = "[card:4111111111111111] [us_ssn:0000000000000000]";
    assert_eq!(m.mask(fake).text, fake);
}

#[test]
fn kinds_left_out_are_not_masked() {
    let cfg: MaskConfig = serde_saphyr::from_str("kinds: [email, ipv4]\n").unwrap();
    let m = Masker::new(&cfg, KEY).unwrap();
    let text = "jane@example.com 555-123-4567 4111111111111111 10.0.0.1 2001:db8::1 123-45-6789";
    let out = m.mask(text);
    assert_eq!(
        out.counts,
        BTreeMap::from([("email".to_owned(), 1), ("ipv4".to_owned(), 1)])
    );
    assert!(out.text.starts_with("[email:"), "{}", out.text);
    assert!(
        out.text.contains("] 555-123-4567 4111111111111111 [ipv4:"),
        "{}",
        out.text
    );
    assert!(
        out.text.ends_with("] 2001:db8::1 123-45-6789"),
        "{}",
        out.text
    );
    // With card masking off, card-shaped token text is not protected either (and not needed).
    let none = Masker::new(
        &MaskConfig {
            kinds: vec![],
            ..MaskConfig::default()
        },
        KEY,
    )
    .unwrap();
    assert_eq!(none.mask(text).text, text);
    assert!(none.mask(text).counts.is_empty());
}

#[test]
fn configured_national_ids() {
    let yaml = "
national_ids:
  - name: de_idcard
    pattern: '[CFGHJKLMNPRTVWXYZ][CFGHJKLMNPRTVWXYZ0-9]{8}'
  - name: us_ssn
    pattern: '[0-9]{3}-[0-9]{2}-[0-9]{4}'
";
    let cfg: MaskConfig = serde_saphyr::from_str(yaml).unwrap();
    assert_eq!(cfg.kinds, PiiKind::ALL.to_vec());
    let m = Masker::new(&cfg, KEY).unwrap();
    assert_masked(&m, "Ausweis L01X00T47 bitte", "L01X00T47", "de_idcard");
    // The configured list replaces the defaults: no NINO pattern any more.
    assert_eq!(m.mask("AB123456C").text, "AB123456C");
    // Word boundaries: no match inside a longer word.
    assert_eq!(m.mask("XL01X00T47").text, "XL01X00T47");
    assert_masked(&m, "000-12-3456", "000-12-3456", "us_ssn");
    // National ids off: the patterns are still checked but not applied.
    let mut off = cfg.clone();
    off.kinds.retain(|&k| k != PiiKind::NationalId);
    let m = Masker::new(&off, KEY).unwrap();
    assert_eq!(m.mask("L01X00T47").text, "L01X00T47");
}

fn config_error(yaml: &str) -> String {
    let cfg: MaskConfig = serde_saphyr::from_str(yaml).unwrap();
    Masker::new(&cfg, KEY).unwrap_err().to_string()
}

#[test]
fn bad_configuration_is_refused_with_its_path() {
    let err = config_error(
        "national_ids:\n  - {name: ok, pattern: 'A[0-9]{3}'}\n  - {name: bad, pattern: '([a-z'}\n",
    );
    assert!(
        err.starts_with("capture.mask.national_ids[1].pattern: "),
        "{err}"
    );
    let err = config_error("national_ids:\n  - {name: '', pattern: 'A[0-9]{3}'}\n");
    assert_eq!(err, "capture.mask.national_ids[0].name: must not be empty");
    let err = config_error("national_ids:\n  - {name: 'My Id', pattern: 'A[0-9]{3}'}\n");
    assert!(
        err.starts_with("capture.mask.national_ids[0].name: "),
        "{err}"
    );
    let err = config_error("national_ids:\n  - {name: card, pattern: 'A[0-9]{3}'}\n");
    assert!(err.contains("built-in kind"), "{err}");
    let err = config_error(
        "national_ids:\n  - {name: a, pattern: 'A[0-9]{3}'}\n  - {name: a, pattern: 'B[0-9]{3}'}\n",
    );
    assert_eq!(err, "capture.mask.national_ids[1].name: duplicate name `a`");
    let err = config_error("national_ids:\n  - {name: a, pattern: '[0-9]*'}\n");
    assert_eq!(
        err,
        "capture.mask.national_ids[0].pattern: matches the empty string"
    );

    assert!(serde_saphyr::from_str::<MaskConfig>("kindz: [email]\n").is_err());
    assert!(serde_saphyr::from_str::<MaskConfig>("kinds: [address]\n").is_err());
    assert!(
        serde_saphyr::from_str::<MaskConfig>(
            "national_ids:\n  - {name: a, pattern: 'A1', flags: i}\n"
        )
        .is_err()
    );
    assert!(serde_saphyr::from_str::<MaskConfig>("national_ids:\n  - {name: a}\n").is_err());

    assert!(matches!(
        Masker::new(&MaskConfig::default(), b""),
        Err(MaskError::EmptyKey)
    ));
    // The keyless check finds the same errors.
    let cfg: MaskConfig =
        serde_saphyr::from_str("national_ids:\n  - {name: x, pattern: 'a('}\n").unwrap();
    let err = cfg.validate().unwrap_err();
    assert!(
        matches!(&err, MaskError::Invalid { path, .. } if path == "capture.mask.national_ids[0].pattern"),
        "{err}"
    );
    assert!(MaskConfig::default().validate().is_ok());
}

#[test]
fn masker_is_shareable() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Masker>();
    // Debug never shows the key.
    let dbg = format!("{:?}", masker());
    assert!(!dbg.contains("test-key") && dbg.contains("us_ssn"), "{dbg}");
}

#[test]
fn long_inputs_are_handled() {
    let m = masker();
    // Long runs of the shapes that feed the hand-written checks.
    let digits_and_spaces = "1 ".repeat(100_000);
    assert_eq!(m.mask(&digits_and_spaces).text, digits_and_spaces);
    let colons = "a:".repeat(100_000);
    assert_eq!(m.mask(&colons).text, colons);
    let dotted = "1.".repeat(100_000);
    assert_eq!(m.mask(&dotted).text, dotted);
    let phones = "+1 ".repeat(100_000);
    assert_eq!(m.mask(&phones).text, phones);
    let many = "card 4111111111111111 ip 10.0.0.1\n".repeat(10_000);
    let out = m.mask(&many);
    assert_eq!(out.counts["card"], 10_000);
    assert_eq!(out.counts["ipv4"], 10_000);
}

/// Pieces that, glued together in any order, make PII shapes, near-misses and their edges.
fn fragment() -> impl Strategy<Value = String> {
    let corpus: Vec<&'static str> = EMAILS
        .iter()
        .chain(PHONES)
        .chain(CARDS)
        .chain(IPV4S)
        .chain(IPV6S)
        .copied()
        .chain(NATIONAL_IDS.iter().map(|(v, _)| *v))
        .chain([
            "v1.2.3.4",
            "1.2.3",
            "::",
            "12:30:45",
            "2026-12-03",
            "[card:",
        ])
        .collect();
    prop_oneof![
        proptest::sample::select(corpus).prop_map(str::to_owned),
        "[0-9]{1,6}",
        "[0-9a-fA-F:.]{1,10}",
        "[ .\\-+@():_\\[\\]x]{1,3}",
        "[a-zA-Zé]{1,4}",
        "\\[(card|phone|email|us_ssn):[0-9a-f]{16}\\]",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_text_masks_without_panic_and_stably(text in any::<String>()) {
        let m = masker();
        let once = m.mask(&text);
        let twice = m.mask(&once.text);
        prop_assert_eq!(&twice.text, &once.text);
        prop_assert!(twice.counts.is_empty());
        prop_assert_eq!(once.total() == 0, once.text == text);
    }

    #[test]
    fn pii_shaped_text_masks_stably(parts in proptest::collection::vec(fragment(), 0..12)) {
        let m = masker();
        let text = parts.concat();
        let once = m.mask(&text);
        let twice = m.mask(&once.text);
        prop_assert_eq!(&twice.text, &once.text, "input {:?}", text);
        prop_assert!(twice.counts.is_empty(), "input {:?}", text);
    }
}

proptest! {
    /// The free-text shortcut skips only text the full scan leaves unchanged.
    #[test]
    fn free_text_shortcut_never_skips_what_masking_finds(
        parts in proptest::collection::vec(fragment(), 0..12),
        filler in "[a-z .-]{0,12}",
    ) {
        let m = masker();
        let text = format!("{filler}{}", parts.concat());
        let full = m.mask(&text);
        let free = m.mask_free_text(&text);
        if full.total() > 0 {
            prop_assert_eq!(free.as_deref(), Some(full.text.as_str()), "input {:?}", text);
        } else {
            prop_assert_eq!(free, None, "input {:?}", text);
        }
    }
}

#[test]
fn free_text_shortcut_passes_over_names_and_scans_what_could_hold_data() {
    let m = masker();
    for plain in [
        "chat llama-3-8b",
        "GET /v1/models",
        "retry 3 of 5",
        "v1.2.3",
    ] {
        assert_eq!(m.mask_free_text(plain), None, "{plain}");
    }
    for (text, kind) in [
        ("from 10.1.2.3", "[ipv4:"),
        ("mail a@b.example", "[email:"),
        ("ip fe80::1:2", "[ipv6:"),
        ("call +44 20 7946 0958", "[phone:"),
        ("ssn 123-45-6789", "[us_ssn:"),
        ("nino AB 12 34 56 C", "[uk_nino:"),
    ] {
        let masked = m.mask_free_text(text).unwrap_or_default();
        assert!(masked.contains(kind), "{text}: {masked:?}");
    }
}
