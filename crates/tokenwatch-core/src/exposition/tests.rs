// Example-based tests of the exposition parser: the real vLLM / dcgm-exporter samples,
// OpenMetrics specifics (EOF, exemplars, units, _total/_created) and located error messages.

use std::borrow::Cow;

use super::*;

fn fixture(name: &str) -> String {
    let path = format!("{}/../../fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

fn family<'f, 'a>(families: &'f [MetricFamily<'a>], name: &str) -> &'f MetricFamily<'a> {
    families
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no family {name}"))
}

fn err(text: &str, format: Format) -> ParseError {
    match parse(text, format) {
        Ok(f) => panic!("expected an error for {text:?}, got {f:?}"),
        Err(e) => e,
    }
}

/// Every sample line lands in the family its TYPE line declared.
fn check_declared_structure(text: &str, families: &[MetricFamily<'_>]) {
    let type_lines = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
    let sample_lines = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    assert_eq!(families.len(), type_lines);
    assert_eq!(
        families.iter().map(|f| f.samples.len()).sum::<usize>(),
        sample_lines
    );
    for f in families {
        assert!(f.help.is_some(), "{} has no HELP", f.name);
        for s in &f.samples {
            assert!(s.name.starts_with(f.name), "{} in {}", s.name, f.name);
            for l in &s.labels {
                assert!(
                    matches!(l.value, Cow::Borrowed(_)),
                    "no escapes, so borrowed"
                );
            }
        }
    }
}

#[test]
fn vllm_gpu_sample() {
    let text = fixture("vllm-metrics.txt");
    let families = parse(&text, Format::PrometheusText).unwrap();
    check_declared_structure(&text, &families);
    let count = |t| families.iter().filter(|f| f.typ == t).count();
    assert_eq!(families.len(), 83);
    assert_eq!(count(MetricType::Counter), 21);
    assert_eq!(count(MetricType::Gauge), 43);
    assert_eq!(count(MetricType::Histogram), 17);
    assert_eq!(count(MetricType::Summary), 2);

    let e2e = family(&families, "vllm:e2e_request_latency_seconds");
    assert_eq!(e2e.typ, MetricType::Histogram);
    let buckets: Vec<_> = e2e.samples_with_suffix("_bucket").collect();
    assert_eq!(buckets.len(), 22);
    let les: Vec<&str> = buckets.iter().map(|s| s.label("le").unwrap()).collect();
    assert_eq!(&les[..3], ["0.3", "0.5", "0.8"]);
    assert_eq!(les[20], "7680.0");
    assert_eq!(les[21], "+Inf");
    assert_eq!(e2e.samples_with_suffix("_sum").count(), 1);
    assert_eq!(e2e.samples_with_suffix("_count").count(), 1);
    assert_eq!(
        buckets[0].label("model_name"),
        Some("Qwen/Qwen2.5-0.5B-Instruct")
    );
    assert_eq!(e2e.suffix_of(buckets[0]), "_bucket");

    // Python prometheus_client text: counters are declared with `_total`, `_created` separately.
    let flops = family(&families, "vllm:estimated_flops_per_gpu_total");
    assert_eq!(flops.typ, MetricType::Counter);
    assert_eq!(flops.samples.len(), 1);
    let created = family(&families, "vllm:estimated_flops_per_gpu_created");
    assert_eq!(created.typ, MetricType::Gauge);
    assert_eq!(created.samples[0].value, 1.7740114612872875e9);

    let rss = family(&families, "process_resident_memory_bytes");
    assert_eq!(rss.samples[0].value, 1.126473728e9);
    assert_eq!(rss.help.as_deref(), Some("Resident memory size in bytes."));
    let http = family(&families, "http_requests_total");
    assert!(http.samples.is_empty(), "declared but no samples yet");
}

#[test]
fn vllm_cpu_sample() {
    let text = fixture("vllm-cpu-metrics.txt");
    let families = parse(&text, Format::PrometheusText).unwrap();
    check_declared_structure(&text, &families);
    assert_eq!(families.len(), 92);
    let prompt = family(&families, "vllm:prompt_tokens_total");
    assert_eq!(prompt.typ, MetricType::Counter);
    assert_eq!(prompt.samples[0].value, 98.0);
    assert_eq!(prompt.samples[0].label("model_name"), Some("tinyllama"));
    assert_eq!(
        family(&families, "vllm:generation_tokens_total").samples[0].value,
        186.0
    );
    let running = family(&families, "vllm:num_requests_running");
    assert_eq!(running.samples[0].label("engine"), Some("0"));
    let e2e = family(&families, "vllm:e2e_request_latency_seconds");
    assert_eq!(e2e.samples_with_suffix("_bucket").count(), 22);
}

#[test]
fn dcgm_sample() {
    let text = fixture("dcgm-exporter.txt");
    let families = parse(&text, Format::PrometheusText).unwrap();
    check_declared_structure(&text, &families);
    assert_eq!(families.len(), 23);
    assert_eq!(
        families
            .iter()
            .filter(|f| f.typ == MetricType::Counter)
            .count(),
        4
    );
    let temp = family(&families, "DCGM_FI_DEV_GPU_TEMP");
    assert_eq!(temp.typ, MetricType::Gauge);
    assert_eq!(temp.help.as_deref(), Some("GPU temperature (in C)."));
    let s = &temp.samples[0];
    assert_eq!(s.value, 32.0);
    let labels: Vec<(&str, &str)> = s
        .labels
        .iter()
        .map(|l| (l.name, l.value.as_ref()))
        .collect();
    assert_eq!(
        labels,
        [
            ("gpu", "0"),
            ("UUID", "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43"),
            ("pci_bus_id", "00000000:00:07.0"),
            ("device", "nvidia0"),
            ("modelName", "NVIDIA L40S"),
            ("Hostname", "gpu1-wl8sg"),
            ("DCGM_FI_DRIVER_VERSION", "595.58.03"),
        ]
    );
    let energy = family(&families, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION");
    assert_eq!(energy.typ, MetricType::Counter);
    assert_eq!(energy.samples[0].value, 5551899580.0);
    assert_eq!(
        family(&families, "DCGM_FI_DEV_POWER_USAGE").samples[0].value,
        35.686
    );
}

#[test]
fn fixtures_as_crlf_and_trailing_whitespace() {
    let text = fixture("dcgm-exporter.txt");
    let expected = parse(&text, Format::PrometheusText).unwrap();
    let crlf = text.replace('\n', " \t\r\n");
    let got = parse(&crlf, Format::PrometheusText).unwrap();
    assert_eq!(got.len(), expected.len());
    for (g, e) in got.iter().zip(&expected) {
        assert_eq!(g.samples, e.samples);
        assert_eq!(g.typ, e.typ);
    }
}

#[test]
fn text_values_timestamps_and_escapes() {
    let text = "# HELP m A \\\\ help\\nline with \\\"quote\\\"\n\
                # TYPE m gauge\n\
                m{a=\"x\\\"y\\\\z\\nw\",b=\"ünï\"} NaN\n\
                m{a=\"1\"} +Inf 1700000000123\n\
                m{a=\"2\"} -Inf\n\
                m{a=\"3\"} Inf\n\
                m{a=\"4\",} 1.5e-3\n\
                m { a = \"5\" , b=\"\" } -42 -5\n\
                m 7E+2\n\
                \n\
                # just a comment\n\
                \tm{a=\"6\"}\t8\t\n";
    let families = parse(text, Format::PrometheusText).unwrap();
    assert_eq!(families.len(), 1);
    let f = &families[0];
    assert_eq!(
        f.help.as_deref(),
        Some("A \\ help\nline with \\\"quote\\\"")
    );
    let s = &f.samples;
    assert_eq!(s.len(), 8);
    assert!(s[0].value.is_nan());
    assert_eq!(s[0].label("a"), Some("x\"y\\z\nw"));
    assert!(matches!(s[0].labels[0].value, Cow::Owned(_)));
    assert_eq!(s[0].label("b"), Some("ünï"));
    assert!(matches!(s[0].labels[1].value, Cow::Borrowed(_)));
    assert_eq!(
        (s[1].value, s[1].timestamp_ms),
        (f64::INFINITY, Some(1_700_000_000_123))
    );
    assert_eq!(s[2].value, f64::NEG_INFINITY);
    assert_eq!(s[3].value, f64::INFINITY);
    assert_eq!(s[4].value, 1.5e-3);
    assert_eq!((s[5].value, s[5].timestamp_ms), (-42.0, Some(-5)));
    assert_eq!(s[5].label("b"), Some(""));
    assert_eq!(s[6].value, 700.0);
    assert!(s[6].labels.is_empty());
    assert_eq!((s[7].value, s[7].label("a")), (8.0, Some("6")));
}

#[test]
fn undeclared_and_suffix_grouping() {
    let text = "up 1\nup 2\nother 3\n\
                # TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\nh_created 9\n\
                h_total 1\n\
                # TYPE s summary\ns{quantile=\"0.5\"} 1\ns_sum 1\ns_count 1\n\
                # TYPE g gauge\ng 1\ng_sum 2\n\
                # TYPE gh gaugehistogram\ngh_bucket{le=\"+Inf\"} 1\ngh_gcount 1\ngh_gsum 1\n\
                # TYPE c counter\nc_total 1\nc_created 1\nc 1\n\
                # TYPE i info\ni_info{v=\"1\"} 1\n";
    let families = parse(text, Format::PrometheusText).unwrap();
    let shape: Vec<(&str, MetricType, usize)> = families
        .iter()
        .map(|f| (f.name, f.typ, f.samples.len()))
        .collect();
    use MetricType::*;
    assert_eq!(
        shape,
        [
            ("up", Unknown, 2),
            ("other", Unknown, 1),
            ("h", Histogram, 5),
            ("h_total", Unknown, 1),
            ("s", Summary, 3),
            ("g", Gauge, 1),
            ("g_sum", Unknown, 1),
            ("gh", GaugeHistogram, 3),
            ("c", Counter, 3),
            ("i", Info, 1),
        ]
    );
}

#[test]
fn openmetrics_document() {
    let text = "# TYPE foo counter\n\
                # UNIT foo seconds\n\
                # HELP foo Total \\\"time\\\".\n\
                foo_total{a=\"b\"} 17.0 1520879607.789 # {trace_id=\"KOO5S4vxi0o\"} 0.67 1520879602.2\n\
                foo_created{a=\"b\"} 1520430000.123\n\
                foo_total{a=\"c\"} 1 # {} 2\n\
                # TYPE vllm:hist histogram\n\
                vllm:hist_bucket{le=\"0.1\"} 0 # {span_id=\"s\"} 0.05\n\
                vllm:hist_bucket{le=\"+Inf\"} 3\n\
                vllm:hist_count 3\n\
                vllm:hist_sum 1.5\n\
                # TYPE build info\n\
                build_info{version=\"1.2\"} 1\n\
                # EOF\n";
    let families = parse(text, Format::OpenMetrics).unwrap();
    assert_eq!(families.len(), 3);
    let foo = &families[0];
    assert_eq!(
        (foo.name, foo.typ, foo.unit),
        ("foo", MetricType::Counter, Some("seconds"))
    );
    assert_eq!(foo.help.as_deref(), Some("Total \"time\"."));
    assert_eq!(foo.samples.len(), 3);
    let s = &foo.samples[0];
    assert_eq!(s.timestamp_ms, Some(1_520_879_607_789));
    let ex = s.exemplar.as_ref().unwrap();
    assert_eq!(ex.labels[0].name, "trace_id");
    assert_eq!(ex.labels[0].value, "KOO5S4vxi0o");
    assert_eq!((ex.value, ex.timestamp), (0.67, Some(1520879602.2)));
    assert_eq!(foo.samples[1].name, "foo_created");
    assert_eq!(foo.samples[1].value, 1520430000.123);
    assert_eq!(foo.samples[2].exemplar.as_ref().unwrap().labels.len(), 0);
    assert_eq!(families[1].samples.len(), 4);
    assert_eq!(
        families[1].samples[0].exemplar.as_ref().unwrap().value,
        0.05
    );
    assert_eq!(
        (families[2].name, families[2].typ),
        ("build", MetricType::Info)
    );
    // Without a trailing newline too; in text mode `# EOF` is only a comment.
    assert!(parse(text.trim_end(), Format::OpenMetrics).is_ok());
    assert!(parse("a 1\n# EOF\nb 2\n", Format::PrometheusText).is_ok());
}

#[test]
fn openmetrics_eof_rules() {
    assert_eq!(parse("# EOF\n", Format::OpenMetrics).unwrap(), vec![]);
    assert_eq!(parse("", Format::PrometheusText).unwrap(), vec![]);
    let e = err("", Format::OpenMetrics);
    assert_eq!((e.line, e.column), (1, 1));
    assert!(e.message.contains("missing \"# EOF\""), "{e}");
    let e = err("a 1\nb 2\n", Format::OpenMetrics);
    assert_eq!(e.line, 3);
    let e = err("a 1\n# EOF\nb 2\n", Format::OpenMetrics);
    assert_eq!((e.line, e.column), (3, 1));
    assert!(e.message.contains("after \"# EOF\""), "{e}");
    let e = err("# EOF\n\n", Format::OpenMetrics);
    assert_eq!(e.line, 2);
}

#[test]
fn errors_name_what_and_where() {
    let cases: &[(&str, Format, usize, usize, &str)] = &[
        (
            "m{model 1",
            Format::PrometheusText,
            1,
            9,
            "expected '=' after label name \"model\"",
        ),
        (
            "ok 1\nm{a=\"x} 1",
            Format::PrometheusText,
            2,
            5,
            "unterminated value of label \"a\"",
        ),
        (
            "m{a=x} 1",
            Format::PrometheusText,
            1,
            5,
            "expected '\"' to open the value of label \"a\"",
        ),
        (
            "m{a=\"x\" b=\"y\"} 1",
            Format::PrometheusText,
            1,
            9,
            "expected ',' or '}'",
        ),
        (
            "m{a=\"\\t\"} 1",
            Format::PrometheusText,
            1,
            6,
            "invalid escape sequence '\\t'",
        ),
        (
            "m{a=\"1\",a=\"2\"} 1",
            Format::PrometheusText,
            1,
            11,
            "duplicate label \"a\"",
        ),
        (
            "m{1=\"1\"} 1",
            Format::PrometheusText,
            1,
            3,
            "expected a label name or '}'",
        ),
        ("m{a=\"1\"", Format::PrometheusText, 1, 8, "missing '}'"),
        (
            "m",
            Format::PrometheusText,
            1,
            2,
            "missing value for metric \"m\"",
        ),
        (
            "m{} abc",
            Format::PrometheusText,
            1,
            5,
            "invalid value \"abc\" for metric \"m\"",
        ),
        (
            "m 1 1.5",
            Format::PrometheusText,
            1,
            5,
            "expected integer milliseconds",
        ),
        (
            "m 1 abc",
            Format::OpenMetrics,
            1,
            5,
            "expected seconds since the epoch",
        ),
        (
            "m 1 2 3",
            Format::PrometheusText,
            1,
            7,
            "unexpected text \"3\"",
        ),
        (
            "m 1 # {a=\"b\"} 1",
            Format::PrometheusText,
            1,
            5,
            "only allowed in OpenMetrics",
        ),
        (
            "m 1 # x",
            Format::OpenMetrics,
            1,
            7,
            "expected '{' to start the exemplar",
        ),
        (
            "m 1 # {a=\"b\"} z",
            Format::OpenMetrics,
            1,
            15,
            "invalid exemplar value",
        ),
        (
            "9m 1",
            Format::PrometheusText,
            1,
            1,
            "expected a metric name or '#'",
        ),
        (
            "mé 1",
            Format::PrometheusText,
            1,
            2,
            "unexpected character 'é' in metric name",
        ),
        (
            "ü{a=\"é\"} x",
            Format::PrometheusText,
            1,
            1,
            "expected a metric name",
        ),
        (
            "m{a=\"é\"} x",
            Format::PrometheusText,
            1,
            10,
            "invalid value \"x\"",
        ),
        (
            "# TYPE m bogus",
            Format::PrometheusText,
            1,
            10,
            "unknown metric type \"bogus\"",
        ),
        (
            "# TYPE m ",
            Format::PrometheusText,
            1,
            10,
            "missing metric type after \"# TYPE m\"",
        ),
        (
            "# TYPE",
            Format::PrometheusText,
            1,
            7,
            "expected a metric name after \"# TYPE\"",
        ),
        (
            "# TYPE m gauge\n# TYPE m counter",
            Format::PrometheusText,
            2,
            1,
            "second TYPE line",
        ),
        (
            "# HELP m x\nm 1\n# TYPE m gauge",
            Format::PrometheusText,
            3,
            1,
            "comes after its samples",
        ),
        (
            " m 1\n# EOF",
            Format::OpenMetrics,
            1,
            1,
            "expected a metric name or '#'",
        ),
    ];
    let more: &[(&str, Format, usize, usize, &str)] = &[
        (
            "m{a=\"x\nb=\"y\"} 1",
            Format::PrometheusText,
            1,
            5,
            "unterminated value of label \"a\"",
        ),
        (
            "m{a=\"x\\\nb 1",
            Format::PrometheusText,
            1,
            5,
            "unterminated value of label \"a\"",
        ),
        (
            "m{a=\"b\"\n} 1",
            Format::PrometheusText,
            1,
            8,
            "missing '}'",
        ),
        (
            "m 1 # {a=\"b\"}\n# EOF",
            Format::OpenMetrics,
            1,
            14,
            "missing exemplar value",
        ),
        (
            "ok 1\r\nm\n",
            Format::PrometheusText,
            2,
            2,
            "missing value for metric \"m\"",
        ),
        (
            "ok 1\nm 1 2 x\ny 1",
            Format::PrometheusText,
            2,
            7,
            "unexpected text \"x\" after",
        ),
    ];
    for &(text, format, line, column, needle) in cases.iter().chain(more) {
        let e = err(text, format);
        assert!(e.message.contains(needle), "{text:?}: {e}");
        assert_eq!((e.line, e.column), (line, column), "{text:?}: {e}");
    }
    let long = format!("m {}", "9x".repeat(500));
    assert!(
        err(&long, Format::PrometheusText).message.len() < 200,
        "messages are bounded"
    );
}

#[test]
fn error_display() {
    let e = err("m{model 1", Format::PrometheusText);
    assert_eq!(
        e.to_string(),
        "line 1, column 9: expected '=' after label name \"model\", found '1'"
    );
}

#[test]
fn pathological_inputs_stay_linear() {
    let many_labels: String = (0..50_000).map(|i| format!("l{i}=\"v\",")).collect();
    let text = format!("m{{{many_labels}}} 1\n");
    let families = parse(&text, Format::PrometheusText).unwrap();
    assert_eq!(families[0].samples[0].labels.len(), 50_000);
    let dup = format!("m{{{many_labels}l7=\"x\"}} 1\n");
    assert!(
        err(&dup, Format::PrometheusText)
            .message
            .contains("duplicate label \"l7\"")
    );
    let escapes = format!("m{{a=\"{}\"}} 1", "\\\\".repeat(100_000));
    assert_eq!(
        parse(&escapes, Format::PrometheusText).unwrap()[0].samples[0].labels[0]
            .value
            .len(),
        100_000
    );
    let undeclared: String = (0..20_000).map(|i| format!("m{i} 1\n")).collect();
    assert_eq!(
        parse(&undeclared, Format::PrometheusText).unwrap().len(),
        20_000
    );
}

#[test]
fn content_type_selects_format() {
    assert_eq!(
        Format::from_content_type("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        Format::OpenMetrics
    );
    assert_eq!(
        Format::from_content_type("text/plain; version=0.0.4"),
        Format::PrometheusText
    );
    assert_eq!(MetricType::Histogram.as_str(), "histogram");
    assert!(MetricType::Counter.suffixes().contains(&"_total"));
}
