// Human-readable numbers for the detectors' summary sentences: bytes, durations, ratios.
// Evidence keeps the raw numbers; these are only for the sentence.

pub(crate) fn bytes(b: f64) -> String {
    const KIB: f64 = 1024.0;
    let a = b.abs();
    if a >= KIB * KIB * KIB {
        format!("{:.1} GiB", b / (KIB * KIB * KIB))
    } else if a >= KIB * KIB {
        format!("{:.0} MiB", b / (KIB * KIB))
    } else if a >= KIB {
        format!("{:.0} KiB", b / KIB)
    } else {
        format!("{b:.0} B")
    }
}

pub(crate) fn duration_s(s: f64) -> String {
    if !s.is_finite() {
        return "never".to_string();
    }
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else if s < 120.0 {
        format!("{s:.1} s")
    } else if s < 7200.0 {
        format!("{:.0} min", s / 60.0)
    } else if s < 172_800.0 {
        format!("{:.1} h", s / 3600.0)
    } else {
        format!("{:.1} days", s / 86_400.0)
    }
}

pub(crate) fn pct(fraction: f64) -> String {
    format!("{:.1}%", fraction * 100.0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats() {
        assert_eq!(super::bytes(256.0 * 1024.0 * 1024.0), "256 MiB");
        assert_eq!(super::bytes(1.5 * 1024.0 * 1024.0 * 1024.0), "1.5 GiB");
        assert_eq!(super::duration_s(840.0), "14 min");
        assert_eq!(super::duration_s(f64::INFINITY), "never");
        assert_eq!(super::pct(0.915), "91.5%");
    }
}
