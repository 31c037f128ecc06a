// Fuzz target: the Prometheus text / OpenMetrics parser on arbitrary UTF-8, in both formats.
// Beyond "no panic", checks the invariants callers rely on (grouping, error locations).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenwatch_core::exposition::{Format, parse};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let lines = text.split('\n').count();
    for format in [Format::PrometheusText, Format::OpenMetrics] {
        match parse(text, format) {
            Ok(families) => {
                for family in &families {
                    for sample in &family.samples {
                        assert!(sample.name.starts_with(family.name));
                    }
                }
            }
            Err(e) => {
                assert!(e.line >= 1 && e.line <= lines + 1, "{e}");
                assert!(e.column >= 1 && !e.message.is_empty(), "{e}");
            }
        }
    }
});
