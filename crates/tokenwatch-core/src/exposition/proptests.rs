// Property tests of the exposition parser: render random families and parse them back,
// arbitrary and mutated input never panics, and concatenated bodies split into the same families.

use proptest::prelude::*;

use super::*;

/// Exemplar labels, value and timestamp in seconds.
type GenExemplar = (Vec<(String, String)>, f64, Option<f64>);

#[derive(Debug, Clone)]
struct GenSample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
    timestamp_ms: Option<i64>,
    exemplar: Option<GenExemplar>,
}

#[derive(Debug, Clone)]
struct GenFamily {
    name: String,
    /// `None`: written without metadata lines (an undeclared family).
    typ: Option<MetricType>,
    help: Option<String>,
    unit: Option<String>,
    help_first: bool,
    samples: Vec<GenSample>,
}

const TYPES: [MetricType; 8] = [
    MetricType::Counter,
    MetricType::Gauge,
    MetricType::Histogram,
    MetricType::GaugeHistogram,
    MetricType::Summary,
    MetricType::Info,
    MetricType::StateSet,
    MetricType::Unknown,
];

fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>(),
        (-1000i64..1000).prop_map(|i| i as f64),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(-0.0),
    ]
}

/// Label values and help texts: unicode plus the characters that need escaping.
fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            3 => any::<char>(),
            1 => prop::sample::select(vec!['"', '\\', '\n', 'n', ' ', '#', '{', '}', ',', '=', 'é', '🦀']),
        ],
        0..12,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

fn labels() -> impl Strategy<Value = Vec<(String, String)>> {
    proptest::collection::vec(("[a-zA-Z_][a-zA-Z0-9_]{0,6}", text()), 0..4).prop_map(
        |mut labels| {
            let mut seen = std::collections::HashSet::new();
            labels.retain(|(name, _)| seen.insert(name.clone()));
            labels
        },
    )
}

fn sample(om: bool) -> impl Strategy<Value = (usize, GenSample)> {
    let exemplar = if om {
        proptest::option::of((labels(), value(), proptest::option::of(0.0f64..2e9))).boxed()
    } else {
        Just(None).boxed()
    };
    (
        any::<usize>(),
        labels(),
        value(),
        proptest::option::of(0i64..4_000_000_000_000),
        exemplar,
    )
        .prop_map(|(suffix, labels, value, timestamp_ms, exemplar)| {
            let s = GenSample {
                name: String::new(),
                labels,
                value,
                timestamp_ms,
                exemplar,
            };
            (suffix, s)
        })
}

/// Families with unique names ending in `_{tag}{i}`, so no name extends another by a suffix.
fn families(om: bool, tag: &'static str) -> impl Strategy<Value = Vec<GenFamily>> {
    let family = (
        "[a-zA-Z_:][a-zA-Z0-9_:]{0,12}",
        proptest::option::weighted(0.85, prop::sample::select(TYPES.to_vec())),
        proptest::option::of(text().prop_filter("no leading blank or trailing CR", |h| {
            !h.starts_with([' ', '\t']) && !h.ends_with('\r')
        })),
        proptest::option::of("[a-z_]{0,8}"),
        any::<bool>(),
        proptest::collection::vec(sample(om), 0..5),
    );
    proptest::collection::vec(family, 0..6).prop_map(move |fams| {
        fams.into_iter()
            .enumerate()
            .map(|(i, (base, typ, help, unit, help_first, samples))| {
                let name = format!("{base}_{tag}{i}");
                let samples = samples
                    .into_iter()
                    .map(|(pick, mut s)| {
                        let suffixes = typ.map_or(&[][..], MetricType::suffixes);
                        let suffix = if pick % (suffixes.len() + 1) == 0 {
                            ""
                        } else {
                            suffixes[pick % (suffixes.len() + 1) - 1]
                        };
                        s.name = format!("{name}{suffix}");
                        s
                    })
                    .collect::<Vec<_>>();
                let (help, unit) = if typ.is_some() {
                    (help, unit)
                } else {
                    (None, None)
                };
                GenFamily {
                    name,
                    typ,
                    help,
                    unit,
                    help_first,
                    samples,
                }
            })
            .filter(|f| f.typ.is_some() || !f.samples.is_empty())
            .collect()
    })
}

fn render_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v:?}")
    }
}

fn render_labels(out: &mut String, labels: &[(String, String)]) {
    out.push('{');
    for (i, (name, value)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(name);
        out.push_str("=\"");
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
}

fn render(families: &[GenFamily], om: bool, eof: bool) -> String {
    let mut out = String::new();
    for f in families {
        if let Some(typ) = f.typ {
            let help = f.help.as_ref().map(|h| {
                let mut escaped = h.replace('\\', "\\\\").replace('\n', "\\n");
                if om {
                    escaped = escaped.replace('"', "\\\"");
                }
                format!("# HELP {} {escaped}\n", f.name)
            });
            let word = if typ == MetricType::Unknown && !om {
                "untyped"
            } else {
                typ.as_str()
            };
            let type_line = format!("# TYPE {} {word}\n", f.name);
            if f.help_first {
                out.extend(help.clone());
            }
            out.push_str(&type_line);
            if !f.help_first {
                out.extend(help);
            }
            if let Some(unit) = &f.unit {
                out.push_str(&format!("# UNIT {} {unit}\n", f.name));
            }
        }
        for s in &f.samples {
            out.push_str(&s.name);
            if !s.labels.is_empty() || s.name.len() % 2 == 0 {
                render_labels(&mut out, &s.labels);
            }
            out.push(' ');
            out.push_str(&render_value(s.value));
            if let Some(ms) = s.timestamp_ms {
                if om {
                    out.push_str(&format!(" {}.{:03}", ms / 1000, ms % 1000));
                } else {
                    out.push_str(&format!(" {ms}"));
                }
            }
            if let Some((labels, value, ts)) = &s.exemplar {
                out.push_str(" # ");
                render_labels(&mut out, labels);
                out.push(' ');
                out.push_str(&render_value(*value));
                if let Some(ts) = ts {
                    out.push_str(&format!(" {ts:?}"));
                }
            }
            out.push('\n');
        }
    }
    if eof {
        out.push_str("# EOF\n");
    }
    out
}

fn same_f64(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || (a == b && a.is_sign_negative() == b.is_sign_negative())
}

fn same_labels(parsed: &[Label<'_>], generated: &[(String, String)]) -> bool {
    parsed.len() == generated.len()
        && parsed
            .iter()
            .zip(generated)
            .all(|(p, (n, v))| p.name == n && p.value == v.as_str())
}

fn check_same(parsed: &[MetricFamily<'_>], generated: &[GenFamily]) -> Result<(), TestCaseError> {
    prop_assert_eq!(parsed.len(), generated.len());
    for (p, g) in parsed.iter().zip(generated) {
        prop_assert_eq!(p.name, g.name.as_str());
        prop_assert_eq!(p.typ, g.typ.unwrap_or(MetricType::Unknown));
        prop_assert_eq!(p.help.as_deref(), g.help.as_deref());
        prop_assert_eq!(p.unit, g.unit.as_deref());
        prop_assert_eq!(p.samples.len(), g.samples.len());
        for (ps, gs) in p.samples.iter().zip(&g.samples) {
            prop_assert_eq!(ps.name, gs.name.as_str());
            prop_assert!(
                same_labels(&ps.labels, &gs.labels),
                "{:?} vs {:?}",
                ps.labels,
                gs.labels
            );
            prop_assert!(same_f64(ps.value, gs.value), "{} vs {}", ps.value, gs.value);
            prop_assert_eq!(ps.timestamp_ms, gs.timestamp_ms);
            match (&ps.exemplar, &gs.exemplar) {
                (None, None) => {}
                (Some(pe), Some((labels, value, ts))) => {
                    prop_assert!(same_labels(&pe.labels, labels));
                    prop_assert!(same_f64(pe.value, *value));
                    prop_assert_eq!(pe.timestamp, *ts);
                }
                (pe, ge) => prop_assert!(false, "exemplar {:?} vs {:?}", pe, ge),
            }
        }
    }
    Ok(())
}

fn format_of(om: bool) -> Format {
    if om {
        Format::OpenMetrics
    } else {
        Format::PrometheusText
    }
}

/// Inserts or deletes near `at` (a fraction of the length), keeping char boundaries.
fn mutate(text: &str, at: f64, delete: usize, insert: &str) -> String {
    let mut i = ((text.len() as f64) * at) as usize;
    while i < text.len() && !text.is_char_boundary(i) {
        i += 1;
    }
    let mut j = (i + delete).min(text.len());
    while j < text.len() && !text.is_char_boundary(j) {
        j += 1;
    }
    format!("{}{insert}{}", &text[..i.min(text.len())], &text[j..])
}

fn check_error_location(text: &str, result: Result<Vec<MetricFamily<'_>>, ParseError>) {
    if let Err(e) = result {
        let lines = text.split('\n').count();
        assert!(e.line >= 1 && e.line <= lines + 1, "{e} for {text:?}");
        assert!(e.column >= 1, "{e}");
        assert!(!e.message.is_empty());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn render_then_parse_round_trips((om, fams) in any::<bool>().prop_flat_map(|om| (Just(om), families(om, "f")))) {
        let text = render(&fams, om, om);
        let parsed = parse(&text, format_of(om)).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        check_same(&parsed, &fams)?;
    }

    #[test]
    fn concatenation_splits_into_the_same_families(
        om in any::<bool>(),
        a in families(false, "a"),
        b in families(false, "b"),
    ) {
        let (ta, tb) = (render(&a, om, false), render(&b, om, om));
        let whole = format!("{ta}{tb}");
        let parsed = parse(&whole, format_of(om)).map_err(|e| TestCaseError::fail(format!("{e}\n{whole}")))?;
        let mut expected: Vec<GenFamily> = a.clone();
        expected.extend(b.iter().cloned());
        check_same(&parsed, &expected)?;
        // And the halves parse on their own into exactly those prefixes.
        let ta_alone = if om { format!("{ta}# EOF\n") } else { ta };
        let first = parse(&ta_alone, format_of(om)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        check_same(&first, &a)?;
    }

    #[test]
    fn arbitrary_strings_never_panic(text in any::<String>()) {
        for format in [Format::PrometheusText, Format::OpenMetrics] {
            check_error_location(&text, parse(&text, format));
        }
    }

    #[test]
    fn exposition_shaped_noise_never_panics(text in "[a-z_:{}=\",# \\\\\n\r\t0-9.+eE-]{0,120}") {
        for format in [Format::PrometheusText, Format::OpenMetrics] {
            check_error_location(&text, parse(&text, format));
        }
    }

    #[test]
    fn mutated_valid_bodies_never_panic(
        om in any::<bool>(),
        fams in families(true, "m"),
        at in 0.0f64..1.0,
        delete in 0usize..4,
        insert in "[a-z{}=\",# \\\\\n0-9.éInfNa+-]{0,3}",
    ) {
        let text = mutate(&render(&fams, om, om), at, delete, &insert);
        for format in [Format::PrometheusText, Format::OpenMetrics] {
            check_error_location(&text, parse(&text, format));
        }
    }
}
