// The exposition parser: one pass over the lines of a Prometheus text 0.0.4 or OpenMetrics 1.0
// body, borrowing names and label values from the input; errors carry 1-based line and column.

use std::borrow::Cow;

use super::{Exemplar, Format, Label, MetricFamily, MetricType, ParseError, Sample};

const NAME_START: u8 = 1;
const NAME_CONT: u8 = 2;
const LABEL_START: u8 = 4;
const LABEL_CONT: u8 = 8;

/// Byte classes: metric names are `[a-zA-Z_:][a-zA-Z0-9_:]*`, label names `[a-zA-Z_][a-zA-Z0-9_]*`.
const CLASS: [u8; 256] = build_classes();

const fn build_classes() -> [u8; 256] {
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        let alpha = c.is_ascii_alphabetic() || c == b'_';
        let mut class = 0;
        if alpha || c == b':' {
            class |= NAME_START | NAME_CONT;
        }
        if c.is_ascii_digit() {
            class |= NAME_CONT | LABEL_CONT;
        }
        if alpha {
            class |= LABEL_START | LABEL_CONT;
        }
        table[i] = class;
        i += 1;
    }
    table
}

/// Longest error-message excerpt of the input, in characters.
const EXCERPT_CHARS: usize = 48;

/// Parses a whole exposition body into metric families, in input order.
///
/// A sample joins the most recent family declared by `# HELP`/`# TYPE`/`# UNIT` when its name
/// is the family name or the family name plus a suffix valid for the family's type (`_total`,
/// `_created`, `_bucket`, `_count`, `_sum`, `_gcount`, `_gsum`, `_info`); otherwise consecutive
/// samples of one undeclared name form a family of type [`MetricType::Unknown`].
/// In OpenMetrics mode the body must end with `# EOF`; exemplars are only accepted there.
pub fn parse(text: &str, format: Format) -> Result<Vec<MetricFamily<'_>>, ParseError> {
    let mut parser = Parser {
        om: format == Format::OpenMetrics,
        families: Vec::new(),
        last: Declared::default(),
        scratch: Vec::new(),
    };
    let mut start = 0;
    let mut lineno = 0;
    let mut eof_at: Option<usize> = None;
    while start < text.len() {
        lineno += 1;
        if let Some(eof_line) = eof_at {
            return Err(ParseError {
                line: lineno,
                column: 1,
                message: format!(
                    "unexpected content after \"# EOF\" (line {eof_line}); OpenMetrics input must end there"
                ),
            });
        }
        let rest = &text[start..];
        // Fast path: a sample line is parsed in place and finds its own end, so the bulk of
        // the body is scanned once. Lines starting with '#' or blanks go the general way.
        if rest
            .as_bytes()
            .first()
            .is_some_and(|&b| CLASS[b as usize] & NAME_START != 0)
        {
            let line = Line {
                s: rest,
                b: rest.as_bytes(),
                no: lineno,
            };
            start += parser.sample(line, 0)? + 1;
            continue;
        }
        let end = rest.find('\n').unwrap_or(rest.len());
        start += end + 1;
        let raw = &rest[..end];
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        let line = Line {
            s: raw,
            b: raw.as_bytes(),
            no: lineno,
        };
        if parser.line(line)? {
            eof_at = Some(lineno);
        }
    }
    if parser.om && eof_at.is_none() {
        return Err(ParseError {
            line: lineno + 1,
            column: 1,
            message: "missing \"# EOF\" at the end of OpenMetrics input (truncated body?)".into(),
        });
    }
    Ok(parser.families)
}

/// What the last family was opened by and which metadata it already has.
#[derive(Default)]
struct Declared {
    /// Opened by a metadata line (as opposed to an undeclared sample).
    declared: bool,
    has_type: bool,
    has_help: bool,
    has_unit: bool,
}

struct Parser<'a> {
    om: bool,
    families: Vec<MetricFamily<'a>>,
    last: Declared,
    /// Reused label buffer; drained into an exactly-sized Vec per sample.
    scratch: Vec<Label<'a>>,
}

/// One input line and its number. `s` may run on past the line's `\n` (the sample fast
/// path): every scanner stops at `\n`, and [`Line::at_end`] is the end test.
#[derive(Clone, Copy)]
struct Line<'a> {
    s: &'a str,
    b: &'a [u8],
    no: usize,
}

impl<'a> Line<'a> {
    fn at_end(&self, p: usize) -> bool {
        p >= self.b.len() || self.b[p] == b'\n'
    }

    /// An error at byte offset `at` of this line; the column counts characters.
    fn err(&self, at: usize, message: String) -> ParseError {
        let at = at.min(self.b.len());
        let column = self.b[..at].iter().filter(|&&b| b & 0xC0 != 0x80).count() + 1;
        ParseError {
            line: self.no,
            column,
            message,
        }
    }

    fn skip_ws(&self, mut p: usize) -> usize {
        while p < self.b.len() && is_ws(self.b[p]) {
            p += 1;
        }
        p
    }

    /// End of the token starting at `p` (next blank or end of line).
    fn token_end(&self, mut p: usize) -> usize {
        while p < self.b.len() && !is_ws(self.b[p]) && self.b[p] != b'\n' {
            p += 1;
        }
        p
    }

    /// End of the name starting at `p` (== `p` when there is none).
    fn scan_name(&self, p: usize, start: u8, cont: u8) -> usize {
        if p >= self.b.len() || CLASS[self.b[p] as usize] & start == 0 {
            return p;
        }
        let mut i = p + 1;
        while i < self.b.len() && CLASS[self.b[i] as usize] & cont != 0 {
            i += 1;
        }
        i
    }

    /// Human description of what is at `p`, for "expected X, found Y" messages.
    fn found(&self, p: usize) -> String {
        match self.s.get(p..).and_then(|rest| rest.chars().next()) {
            None | Some('\n') => "end of line".into(),
            Some(c) => format!("{c:?}"),
        }
    }
}

/// Blanks between tokens; `\r` counts so that `\r\n` line ends need no special case.
fn is_ws(b: u8) -> bool {
    b == b' ' || b == b'\t' || b == b'\r'
}

/// At most [`EXCERPT_CHARS`] characters of `s`'s first line, quoted, for error messages.
fn excerpt(s: &str) -> String {
    let s = s.split('\n').next().unwrap_or("").trim_end_matches('\r');
    match s.char_indices().nth(EXCERPT_CHARS) {
        Some((cut, _)) => format!("\"{}…\"", &s[..cut]),
        None => format!("\"{s}\""),
    }
}

fn trim_end_ws(s: &str) -> &str {
    s.trim_end_matches([' ', '\t'])
}

impl<'a> Parser<'a> {
    /// Handles one line; returns true when it was the OpenMetrics `# EOF` marker.
    fn line(&mut self, line: Line<'a>) -> Result<bool, ParseError> {
        // Prometheus text tolerates indentation; OpenMetrics does not.
        let start = if self.om { 0 } else { line.skip_ws(0) };
        if trim_end_ws(line.s).len() <= start {
            return Ok(false); // blank line
        }
        if line.b[start] == b'#' {
            return self.comment(line, start);
        }
        self.sample(line, start)?;
        Ok(false)
    }

    fn comment(&mut self, line: Line<'a>, hash: usize) -> Result<bool, ParseError> {
        let kw_start = line.skip_ws(hash + 1);
        let kw_end = line.token_end(kw_start);
        let keyword = &line.s[kw_start..kw_end];
        match keyword {
            "HELP" | "TYPE" | "UNIT" => {}
            "EOF" => return Ok(self.om && hash == 0 && trim_end_ws(&line.s[kw_end..]).is_empty()),
            _ => return Ok(false), // a plain comment
        }
        let p = line.skip_ws(kw_end);
        let name_end = line.scan_name(p, NAME_START, NAME_CONT);
        if name_end == p {
            return Err(line.err(
                p,
                format!(
                    "expected a metric name after \"# {keyword}\", found {}",
                    line.found(p)
                ),
            ));
        }
        if !line.at_end(name_end) && !is_ws(line.b[name_end]) {
            return Err(line.err(
                name_end,
                format!(
                    "unexpected character {} in metric name after \"# {keyword}\"",
                    line.found(name_end)
                ),
            ));
        }
        let name = &line.s[p..name_end];
        // Only spaces and tabs separate the docstring: a `\r` there is part of the HELP text.
        let rest_at = name_end + line.s[name_end..].len()
            - line.s[name_end..].trim_start_matches([' ', '\t']).len();
        let rest = &line.s[rest_at..];
        match keyword {
            "HELP" => {
                let idx = self.family_for_metadata(name);
                if self.last.has_help {
                    return Err(line.err(0, format!("second HELP line for metric \"{name}\"")));
                }
                self.last.has_help = true;
                self.families[idx].help = Some(unescape_help(rest, self.om));
            }
            "TYPE" => {
                let word = trim_end_ws(rest);
                if word.is_empty() {
                    return Err(line.err(
                        rest_at,
                        format!("missing metric type after \"# TYPE {name}\""),
                    ));
                }
                let typ = parse_type(word).ok_or_else(|| {
                    line.err(
                        rest_at,
                        format!(
                            "unknown metric type {} for \"{name}\"; expected counter, gauge, histogram, \
                             gaugehistogram, summary, info, stateset, unknown or untyped",
                            excerpt(word)
                        ),
                    )
                })?;
                let idx = self.family_for_metadata(name);
                if self.last.has_type {
                    return Err(line.err(0, format!("second TYPE line for metric \"{name}\"")));
                }
                if !self.families[idx].samples.is_empty() {
                    return Err(line.err(
                        0,
                        format!("TYPE line for metric \"{name}\" comes after its samples"),
                    ));
                }
                self.last.has_type = true;
                self.families[idx].typ = typ;
            }
            _ => {
                let unit = trim_end_ws(rest);
                let idx = self.family_for_metadata(name);
                if self.last.has_unit {
                    return Err(line.err(0, format!("second UNIT line for metric \"{name}\"")));
                }
                self.last.has_unit = true;
                self.families[idx].unit = Some(unit);
            }
        }
        Ok(false)
    }

    /// The family a HELP/TYPE/UNIT line for `name` describes: the last one if it was
    /// declared under that name, else a new one.
    fn family_for_metadata(&mut self, name: &'a str) -> usize {
        if self.last.declared && self.families.last().is_some_and(|f| f.name == name) {
            return self.families.len() - 1;
        }
        self.families.push(MetricFamily {
            name,
            typ: MetricType::Unknown,
            help: None,
            unit: None,
            samples: Vec::new(),
        });
        self.last = Declared {
            declared: true,
            ..Declared::default()
        };
        self.families.len() - 1
    }

    /// Parses the sample line at `start`; returns the offset of its end (`\n` or end of text).
    fn sample(&mut self, line: Line<'a>, start: usize) -> Result<usize, ParseError> {
        let name_end = line.scan_name(start, NAME_START, NAME_CONT);
        if name_end == start {
            return Err(line.err(
                start,
                format!("expected a metric name or '#', found {}", line.found(start)),
            ));
        }
        let name = &line.s[start..name_end];
        let mut p = name_end;
        if !line.at_end(p) && line.b[p] != b'{' && !is_ws(line.b[p]) {
            return Err(line.err(
                p,
                format!(
                    "unexpected character {} in metric name \"{name}\"",
                    line.found(p)
                ),
            ));
        }
        p = line.skip_ws(p);
        let labels = if !line.at_end(p) && line.b[p] == b'{' {
            p = self.labels(line, p, name)?;
            self.scratch.drain(..).collect()
        } else {
            Vec::new()
        };
        p = line.skip_ws(p);
        if line.at_end(p) {
            return Err(line.err(p, format!("missing value for metric \"{name}\"")));
        }
        let value_end = line.token_end(p);
        let value = parse_value(&line.s[p..value_end]).ok_or_else(|| {
            line.err(
                p,
                format!(
                    "invalid value {} for metric \"{name}\": expected a number, NaN, +Inf or -Inf",
                    excerpt(&line.s[p..value_end])
                ),
            )
        })?;
        p = line.skip_ws(value_end);
        let mut timestamp_ms = None;
        if !line.at_end(p) && line.b[p] != b'#' {
            let ts_end = line.token_end(p);
            timestamp_ms = Some(self.timestamp(line, p, ts_end, name)?);
            p = line.skip_ws(ts_end);
        }
        let mut exemplar = None;
        if !line.at_end(p) {
            if line.b[p] != b'#' {
                return Err(line.err(
                    p,
                    format!(
                        "unexpected text {} after the timestamp of metric \"{name}\"",
                        excerpt(&line.s[p..])
                    ),
                ));
            }
            let (parsed, end) = self.exemplar(line, p, name)?;
            exemplar = Some(parsed);
            p = end;
        }
        self.push_sample(Sample {
            name,
            labels,
            value,
            timestamp_ms,
            exemplar,
        });
        Ok(p)
    }

    fn timestamp(
        &self,
        line: Line<'a>,
        p: usize,
        end: usize,
        name: &str,
    ) -> Result<i64, ParseError> {
        let tok = &line.s[p..end];
        if self.om {
            let secs = tok.parse::<f64>().ok().filter(|s| s.is_finite());
            let ms = secs
                .map(|s| (s * 1000.0).round())
                .filter(|ms| ms.abs() < 9.2e18);
            ms.map(|ms| ms as i64).ok_or_else(|| {
                line.err(
                    p,
                    format!("invalid timestamp {} for metric \"{name}\": expected seconds since the epoch", excerpt(tok)),
                )
            })
        } else {
            tok.parse::<i64>().map_err(|_| {
                line.err(
                    p,
                    format!(
                        "invalid timestamp {} for metric \"{name}\": expected integer milliseconds since the epoch",
                        excerpt(tok)
                    ),
                )
            })
        }
    }

    /// Parses `# {labels} value [timestamp]` starting at the `#`.
    fn exemplar(
        &mut self,
        line: Line<'a>,
        p: usize,
        name: &str,
    ) -> Result<(Exemplar<'a>, usize), ParseError> {
        if !self.om {
            return Err(line.err(
                p,
                format!(
                    "unexpected '#' after the value of metric \"{name}\": exemplars are only allowed in OpenMetrics"
                ),
            ));
        }
        let mut p = line.skip_ws(p + 1);
        if line.at_end(p) || line.b[p] != b'{' {
            return Err(line.err(
                p,
                format!(
                    "expected '{{' to start the exemplar labels of metric \"{name}\", found {}",
                    line.found(p)
                ),
            ));
        }
        p = self.labels(line, p, name)?;
        let labels: Vec<Label<'a>> = self.scratch.drain(..).collect();
        p = line.skip_ws(p);
        if line.at_end(p) {
            return Err(line.err(p, format!("missing exemplar value for metric \"{name}\"")));
        }
        let value_end = line.token_end(p);
        let value = parse_value(&line.s[p..value_end]).ok_or_else(|| {
            line.err(
                p,
                format!(
                    "invalid exemplar value {} for metric \"{name}\"",
                    excerpt(&line.s[p..value_end])
                ),
            )
        })?;
        p = line.skip_ws(value_end);
        let mut timestamp = None;
        if !line.at_end(p) {
            let ts_end = line.token_end(p);
            let tok = &line.s[p..ts_end];
            timestamp = Some(tok.parse::<f64>().ok().filter(|t| t.is_finite()).ok_or_else(|| {
                line.err(
                    p,
                    format!("invalid exemplar timestamp {} for metric \"{name}\": expected seconds", excerpt(tok)),
                )
            })?);
            p = line.skip_ws(ts_end);
            if !line.at_end(p) {
                return Err(line.err(
                    p,
                    format!(
                        "unexpected text {} after the exemplar of metric \"{name}\"",
                        excerpt(&line.s[p..])
                    ),
                ));
            }
        }
        Ok((
            Exemplar {
                labels,
                value,
                timestamp,
            },
            p,
        ))
    }

    /// Parses `{name="value",...}` starting at `{` into `self.scratch`; returns the offset
    /// after `}`. `metric` names the series in messages.
    fn labels(&mut self, line: Line<'a>, open: usize, metric: &str) -> Result<usize, ParseError> {
        self.scratch.clear();
        let mut p = open + 1;
        loop {
            p = line.skip_ws(p);
            if !line.at_end(p) && line.b[p] == b'}' {
                p += 1;
                break;
            }
            let name_end = line.scan_name(p, LABEL_START, LABEL_CONT);
            if name_end == p {
                let what = if line.at_end(p) {
                    format!("missing '}}' to close the labels of metric \"{metric}\"")
                } else {
                    format!(
                        "expected a label name or '}}' in metric \"{metric}\", found {}",
                        line.found(p)
                    )
                };
                return Err(line.err(p, what));
            }
            let name = &line.s[p..name_end];
            p = line.skip_ws(name_end);
            if line.at_end(p) || line.b[p] != b'=' {
                return Err(line.err(
                    p,
                    format!(
                        "expected '=' after label name \"{name}\", found {}",
                        line.found(p)
                    ),
                ));
            }
            p = line.skip_ws(p + 1);
            if line.at_end(p) || line.b[p] != b'"' {
                return Err(line.err(
                    p,
                    format!(
                        "expected '\"' to open the value of label \"{name}\", found {}",
                        line.found(p)
                    ),
                ));
            }
            let (value, after) = label_value(line, p + 1, name)?;
            if self.scratch.len() < 16 && self.scratch.iter().any(|l| l.name == name) {
                return Err(line.err(
                    p,
                    format!("duplicate label \"{name}\" in metric \"{metric}\""),
                ));
            }
            self.scratch.push(Label { name, value });
            p = line.skip_ws(after);
            match line.b.get(p).filter(|&&b| b != b'\n') {
                Some(b',') => p += 1,
                Some(b'}') => {
                    p += 1;
                    break;
                }
                None => {
                    return Err(line.err(
                        p,
                        format!("missing '}}' to close the labels of metric \"{metric}\""),
                    ));
                }
                Some(_) => {
                    return Err(line.err(
                        p,
                        format!(
                            "expected ',' or '}}' after the value of label \"{name}\", found {}",
                            line.found(p)
                        ),
                    ));
                }
            }
        }
        if self.scratch.len() > 16 {
            // Checked by sorting so that a pathological line stays O(n log n).
            let mut names: Vec<&str> = self.scratch.iter().map(|l| l.name).collect();
            names.sort_unstable();
            if let Some(dup) = names.windows(2).find(|w| w[0] == w[1]) {
                return Err(line.err(
                    open,
                    format!("duplicate label \"{}\" in metric \"{metric}\"", dup[0]),
                ));
            }
        }
        Ok(p)
    }

    fn push_sample(&mut self, sample: Sample<'a>) {
        if let Some(family) = self.families.last_mut() {
            let joins = if self.last.declared {
                belongs(family.typ, family.name, sample.name)
            } else {
                family.name == sample.name
            };
            if joins {
                family.samples.push(sample);
                return;
            }
        }
        self.families.push(MetricFamily {
            name: sample.name,
            typ: MetricType::Unknown,
            help: None,
            unit: None,
            samples: vec![sample],
        });
        self.last = Declared::default();
    }
}

/// Reads a quoted label value starting just after the opening quote; returns the unescaped
/// value and the offset after the closing quote.
fn label_value<'a>(
    line: Line<'a>,
    start: usize,
    label: &str,
) -> Result<(Cow<'a, str>, usize), ParseError> {
    let b = line.b;
    let unterminated = || {
        line.err(
            start - 1,
            format!("unterminated value of label \"{label}\" (missing closing '\"')"),
        )
    };
    let mut i = start;
    while i < b.len() {
        match b[i] {
            b'"' => return Ok((Cow::Borrowed(&line.s[start..i]), i + 1)),
            b'\\' | b'\n' => break,
            _ => i += 1,
        }
    }
    if i >= b.len() || b[i] == b'\n' {
        return Err(unterminated());
    }
    let mut out = String::with_capacity(i - start + 8);
    out.push_str(&line.s[start..i]);
    while i < b.len() {
        match b[i] {
            b'"' => return Ok((Cow::Owned(out), i + 1)),
            b'\\' => {
                match b.get(i + 1) {
                    Some(b'\\') => out.push('\\'),
                    Some(b'"') => out.push('"'),
                    Some(b'n') => out.push('\n'),
                    None | Some(b'\n') => return Err(unterminated()),
                    Some(_) => {
                        return Err(line.err(
                            i,
                            format!(
                                "invalid escape sequence '\\{}' in the value of label \"{label}\" \
                                 (allowed: \\\\, \\\" and \\n)",
                                line.found(i + 1).trim_matches('\'')
                            ),
                        ));
                    }
                }
                i += 2;
            }
            b'\n' => break,
            _ => {
                let run = i;
                while i < b.len() && !matches!(b[i], b'"' | b'\\' | b'\n') {
                    i += 1;
                }
                out.push_str(&line.s[run..i]);
            }
        }
    }
    Err(unterminated())
}

/// HELP text: `\\` and `\n` are escapes (and `\"` in OpenMetrics); other backslashes stay.
fn unescape_help(text: &str, om: bool) -> Cow<'_, str> {
    if !text.contains('\\') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.clone().next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some('"') if om => out.push('"'),
            _ => {
                out.push('\\');
                continue;
            }
        }
        chars.next();
    }
    Cow::Owned(out)
}

/// Sample values: decimal or exponent floats, `NaN`, `+Inf`, `-Inf`, `Inf`.
fn parse_value(tok: &str) -> Option<f64> {
    tok.parse::<f64>().ok()
}

fn parse_type(word: &str) -> Option<MetricType> {
    const TYPES: [(&str, MetricType); 9] = [
        ("counter", MetricType::Counter),
        ("gauge", MetricType::Gauge),
        ("histogram", MetricType::Histogram),
        ("gaugehistogram", MetricType::GaugeHistogram),
        ("summary", MetricType::Summary),
        ("info", MetricType::Info),
        ("stateset", MetricType::StateSet),
        ("unknown", MetricType::Unknown),
        ("untyped", MetricType::Unknown),
    ];
    TYPES
        .iter()
        .find(|(w, _)| w.eq_ignore_ascii_case(word))
        .map(|(_, t)| *t)
}

/// The series-name suffixes that belong to a family of each type.
pub(super) fn suffixes(typ: MetricType) -> &'static [&'static str] {
    match typ {
        MetricType::Counter => &["_total", "_created"],
        MetricType::Histogram => &["_bucket", "_count", "_sum", "_created"],
        MetricType::GaugeHistogram => &["_bucket", "_gcount", "_gsum"],
        MetricType::Summary => &["_count", "_sum", "_created"],
        MetricType::Info => &["_info"],
        MetricType::Gauge | MetricType::StateSet | MetricType::Unknown => &[],
    }
}

fn belongs(typ: MetricType, family: &str, sample: &str) -> bool {
    match sample.strip_prefix(family) {
        Some("") => true,
        Some(suffix) => suffixes(typ).contains(&suffix),
        None => false,
    }
}
