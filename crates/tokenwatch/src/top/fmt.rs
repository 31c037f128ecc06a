// Number formatting of `tokenwatch top` (every value with its unit, "–" when unknown) and the
// one-line unicode sparkline drawn from a trend series.

use chrono::{Local, TimeZone};

pub const MISSING: &str = "–";

/// Seconds as a latency: `0.42 ms`, `41.0 ms`, `412 ms`, `1.23 s`.
pub fn latency(s: Option<f64>) -> String {
    let Some(s) = s.filter(|v| v.is_finite()) else {
        return MISSING.into();
    };
    let ms = s * 1000.0;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 100.0 {
        format!("{ms:.1} ms")
    } else if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else if s < 10.0 {
        format!("{s:.2} s")
    } else if s < 100.0 {
        format!("{s:.1} s")
    } else {
        format!("{s:.0} s")
    }
}

/// A per-second rate: `0.25/s`, `4.1/s`, `410/s`, `12.3k/s`.
pub fn rate(v: Option<f64>) -> String {
    let Some(v) = v.filter(|v| v.is_finite()) else {
        return MISSING.into();
    };
    if v < 1.0 {
        format!("{v:.2}/s")
    } else if v < 100.0 {
        format!("{v:.1}/s")
    } else if v < 10_000.0 {
        format!("{v:.0}/s")
    } else {
        format!("{:.1}k/s", v / 1000.0)
    }
}

/// A 0..1 ratio as a percentage with `decimals` places.
pub fn percent(r: Option<f64>, decimals: usize) -> String {
    match r.filter(|v| v.is_finite()) {
        Some(r) => format!("{:.*}%", decimals, r * 100.0),
        None => MISSING.into(),
    }
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// GPU memory: `56.8/74.5 GiB`, else `56.8 GiB`, else the ratio `76%`.
pub fn gpu_memory(used: Option<f64>, total: Option<f64>, ratio: Option<f64>) -> String {
    match (
        used.filter(|v| v.is_finite()),
        total.filter(|v| v.is_finite() && *v > 0.0),
    ) {
        (Some(u), Some(t)) => format!("{:.1}/{:.0} GiB", u / GIB, t / GIB),
        (Some(u), None) => format!("{:.1} GiB", u / GIB),
        _ => percent(ratio, 0),
    }
}

/// A count as text, `–` when unknown.
pub fn count(v: Option<f64>) -> String {
    v.filter(|v| v.is_finite())
        .map_or(MISSING.into(), |v| format!("{v:.0}"))
}

/// Local wall-clock time of a Unix-millisecond instant.
pub fn clock(unix_ms: Option<i64>) -> String {
    unix_ms
        .and_then(|ms| Local.timestamp_millis_opt(ms).single())
        .map_or(MISSING.into(), |t| t.format("%H:%M:%S").to_string())
}

const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// The last `width` points as bars scaled from 0 to the largest point; gaps are blanks, and
/// a series shorter than `width` is right-aligned so "now" is always the right edge.
pub fn sparkline(values: &[Option<f64>], width: usize) -> String {
    let tail = &values[values.len().saturating_sub(width)..];
    let max = tail
        .iter()
        .flatten()
        .copied()
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max);
    let mut out = " ".repeat(width - tail.len());
    for v in tail {
        out.push(match v.filter(|v| v.is_finite() && *v >= 0.0) {
            None => ' ',
            Some(_) if max <= 0.0 => BARS[0],
            Some(v) => BARS[((v / max) * 7.0).round().clamp(0.0, 7.0) as usize],
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_carry_units() {
        assert_eq!(latency(Some(0.00042)), "0.42 ms");
        assert_eq!(latency(Some(0.041)), "41.0 ms");
        assert_eq!(latency(Some(0.412)), "412 ms");
        assert_eq!(latency(Some(1.234)), "1.23 s");
        assert_eq!(latency(Some(60.95)), "61.0 s");
        assert_eq!(latency(Some(612.0)), "612 s");
        assert_eq!(latency(None), MISSING);
        assert_eq!(latency(Some(f64::NAN)), MISSING);
        assert_eq!(rate(Some(0.25)), "0.25/s");
        assert_eq!(rate(Some(4.14)), "4.1/s");
        assert_eq!(rate(Some(410.2)), "410/s");
        assert_eq!(rate(Some(12_345.0)), "12.3k/s");
        assert_eq!(percent(Some(0.0123), 1), "1.2%");
        assert_eq!(percent(Some(0.42), 0), "42%");
        assert_eq!(
            gpu_memory(Some(61.0 * GIB), Some(80.0 * GIB), None),
            "61.0/80 GiB"
        );
        assert_eq!(gpu_memory(Some(6.0 * GIB), None, None), "6.0 GiB");
        assert_eq!(gpu_memory(None, None, Some(0.76)), "76%");
        assert_eq!(gpu_memory(None, None, None), MISSING);
        assert_eq!(count(Some(3.0)), "3");
    }

    #[test]
    fn sparkline_scales_to_the_max_and_keeps_gaps() {
        assert_eq!(
            sparkline(&[Some(0.0), Some(0.5), None, Some(1.0)], 4),
            "▁▅ █"
        );
        assert_eq!(
            sparkline(&[Some(1.0), Some(2.0)], 5),
            "   ▅█",
            "right-aligned"
        );
        assert_eq!(
            sparkline(&[Some(9.0), Some(0.0), Some(2.0), Some(4.0)], 2),
            "▅█",
            "keeps the newest points"
        );
        assert_eq!(sparkline(&[Some(0.0), Some(0.0)], 2), "▁▁");
        assert_eq!(sparkline(&[], 3), "   ");
    }
}
