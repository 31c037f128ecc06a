// Durations of the configuration and the command line: Prometheus syntax (`1h30m`, `90s`, `7d`,
// `2w`, `1y`, `250ms`, `0`) plus decimal amounts (`1.5s`, `0.25h`), parsed exactly to nanoseconds;
// `HumanDuration`, the type every stage's configuration section holds them in.

use serde::Deserialize;
use std::time::Duration;

const NS_PER_S: u128 = 1_000_000_000;

/// Units from largest to smallest, with their length in nanoseconds (a year is 365 days, as in
/// Prometheus).
const UNITS: [(&str, u128); 7] = [
    ("y", 365 * 86_400 * NS_PER_S),
    ("w", 7 * 86_400 * NS_PER_S),
    ("d", 86_400 * NS_PER_S),
    ("h", 3_600 * NS_PER_S),
    ("m", 60 * NS_PER_S),
    ("s", NS_PER_S),
    ("ms", 1_000_000),
];

/// What the published JSON Schema accepts for a duration: the terms `parse` reads (it alone checks
/// their order), `0`, or a value holding a `${NAME}` that is expanded before parsing.
pub const SCHEMA_PATTERN: &str =
    r"^\s*(0|([0-9]+(\.[0-9]+)?(ms|s|m|h|d|w|y))+|.*\$\{[A-Za-z_][A-Za-z0-9_]*\}.*)\s*$";

/// Parse `s`: one or more `<amount><unit>` terms, units from largest to smallest and each at
/// most once (`1h30m`, not `30m1h`), amounts whole or decimal; `0` alone is zero.
pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let invalid = |why: &str| format!("invalid duration {s:?}: {why}");
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(invalid("expected e.g. 250ms, 5s, 1h30m or 1.5s"));
    }
    let mut rest = s;
    let mut total: u128 = 0;
    let mut last_rank: Option<usize> = None;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        rest = next;
        if num.is_empty() {
            return Err(invalid(
                "expected a number followed by a unit (ms, s, m, h, d, w, y)",
            ));
        }
        let Some(rank) = UNITS.iter().position(|(u, _)| *u == unit) else {
            return Err(invalid("unit must be one of ms, s, m, h, d, w, y"));
        };
        if last_rank.is_some_and(|last| rank <= last) {
            return Err(invalid(
                "units must go from largest to smallest, each once, e.g. 1h30m",
            ));
        }
        last_rank = Some(rank);
        let ns =
            amount_ns(num, UNITS[rank].1).ok_or_else(|| invalid("not a number, or too large"))?;
        total = total.checked_add(ns).ok_or_else(|| invalid("too large"))?;
    }
    let secs = u64::try_from(total / NS_PER_S).map_err(|_| invalid("too large"))?;
    Ok(Duration::new(secs, (total % NS_PER_S) as u32))
}

/// `num` (`12`, `1.5`, `.5`) units of `unit_ns` nanoseconds, digits beyond a nanosecond
/// dropped; `None` for a malformed number or an overflow.
fn amount_ns(num: &str, unit_ns: u128) -> Option<u128> {
    let (int, frac) = match num.split_once('.') {
        Some((i, f)) if !f.is_empty() && !f.contains('.') => (i, f),
        Some(_) => return None,
        None => (num, ""),
    };
    let whole: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut ns = whole.checked_mul(unit_ns)?;
    if !frac.is_empty() {
        // 18 digits are below a nanosecond of a year and keep the product within u128.
        let digits = &frac[..frac.len().min(18)];
        let scale = 10u128.pow(digits.len() as u32);
        let f: u128 = digits.parse().ok()?;
        ns = ns.checked_add(f * unit_ns / scale)?;
    }
    Some(ns)
}

/// A duration in Prometheus syntax (`250ms`, `5s`, `1h30m`, `7d`, `2w`) or with a decimal amount
/// (`1.5s`); see `parse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

/// Written back in the same syntax, in the largest unit that holds it exactly (`90s` stays
/// `90s`, `1h30m` becomes `90m`, `2w` stays `2w`), so `parse` reads back the same duration.
impl std::fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const UNITS: [(&str, u128); 6] = [
            ("w", 7 * 86_400 * 1_000_000_000),
            ("d", 86_400 * 1_000_000_000),
            ("h", 3_600 * 1_000_000_000),
            ("m", 60 * 1_000_000_000),
            ("s", 1_000_000_000),
            ("ms", 1_000_000),
        ];
        let nanos = self.0.as_nanos();
        if nanos == 0 {
            return f.write_str("0");
        }
        match UNITS.iter().find(|(_, n)| nanos.is_multiple_of(*n)) {
            Some((unit, n)) => write!(f, "{}{unit}", nanos / n),
            None => write!(f, "{}s", self.0.as_secs_f64()),
        }
    }
}

impl serde::Serialize for HumanDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl HumanDuration {
    pub fn parse(s: &str) -> Result<HumanDuration, String> {
        parse(s).map(HumanDuration)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        HumanDuration::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// In the published schema: a string in the same syntax (checked by pattern; the loader's
/// parser is the authority and names the key when a value is wrong).
impl schemars::JsonSchema for HumanDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "A duration in Prometheus syntax (250ms, 5s, 1h30m, 7d, 2w) or with a decimal amount (1.5s)",
            "pattern": SCHEMA_PATTERN,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_syntax_and_decimals() {
        let ms = Duration::from_millis;
        for (s, want) in [
            ("250ms", ms(250)),
            ("5s", ms(5_000)),
            ("10m", ms(600_000)),
            ("2h", ms(7_200_000)),
            ("7d", ms(7 * 86_400_000)),
            ("2w", ms(14 * 86_400_000)),
            ("1y", ms(365 * 86_400_000)),
            ("1h30m", ms(5_400_000)),
            (
                "1d2h3m4s5ms",
                ms(86_400_000 + 7_200_000 + 180_000 + 4_000 + 5),
            ),
            ("1.5s", ms(1_500)),
            ("0.25h", ms(900_000)),
            (".5m", ms(30_000)),
            ("1m0.5s", ms(60_500)),
            ("1.5ms", Duration::from_micros(1_500)),
            ("0.1s", ms(100)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            (" 30s ", ms(30_000)),
        ] {
            assert_eq!(parse(s), Ok(want), "{s}");
        }
        assert_eq!(parse("0.000000001s"), Ok(Duration::from_nanos(1)));
    }

    #[test]
    fn malformed_durations_are_explained() {
        for (s, why) in [
            ("", "expected"),
            ("5", "unit must be one of"),
            ("5 s", "unit must be one of"),
            ("7 weeks", "unit must be one of"),
            ("5sec", "unit must be one of"),
            ("s", "expected a number"),
            ("30m1h", "largest to smallest"),
            ("1h1h", "largest to smallest"),
            ("1.2.3s", "not a number"),
            ("1.s", "not a number"),
            ("-5s", "expected a number"),
            ("99999999999999999999999999999999999999999y", "too large"),
            ("600000000000y", "too large"),
        ] {
            let err = parse(s).unwrap_err();
            assert!(
                err.contains("invalid duration") && err.contains(why),
                "{s:?}: {err}"
            );
        }
    }

    #[test]
    fn written_back_in_the_same_syntax_and_read_back_the_same() {
        for (text, shown) in [
            ("90s", "90s"),
            ("1h30m", "90m"),
            ("2w", "2w"),
            ("250ms", "250ms"),
            ("0", "0"),
            ("1.5s", "1500ms"),
            ("7d", "1w"),
        ] {
            let d = HumanDuration::parse(text).unwrap();
            assert_eq!(d.to_string(), shown, "{text}");
            assert_eq!(HumanDuration::parse(shown).unwrap(), d, "{text}");
            assert_eq!(serde_json::to_value(d).unwrap(), serde_json::json!(shown));
        }
        let odd = HumanDuration(Duration::from_nanos(1_500));
        assert_eq!(HumanDuration::parse(&odd.to_string()).unwrap(), odd);
    }
}
