// Drawing of the `tokenwatch top` screen from its state into a ratatui Frame: header, per-model
// table (only the rows that fit are built) and the detail pane. No I/O happens here.

use super::fmt;
use super::model::{ModelRow, severity_rank};
use super::state::{SortKey, TopState};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, TableState};

/// A table column: what it shows, its width (the model id and the trend stretch) and when it is
/// left out on a narrow terminal (1 goes first; 0 never).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Col {
    Key(SortKey),
    Trend,
}

const TABLE: [(Col, &str, u16, u8); 12] = [
    (Col::Key(SortKey::Model), "MODEL", 12, 0),
    (Col::Key(SortKey::TtftP50), "TTFT p50", 9, 5),
    (Col::Key(SortKey::TtftP99), "TTFT p99", 9, 0),
    (Col::Key(SortKey::ItlP50), "ITL p50", 9, 4),
    (Col::Key(SortKey::ItlP99), "ITL p99", 9, 7),
    (Col::Key(SortKey::Requests), "REQ/S", 8, 0),
    (Col::Key(SortKey::Tokens), "TOK/S", 8, 6),
    (Col::Key(SortKey::Errors), "ERR", 6, 8),
    (Col::Key(SortKey::KvCache), "KV", 5, 9),
    (Col::Key(SortKey::GpuMemory), "GPU MEM", 13, 3),
    (Col::Key(SortKey::Alerts), "ALERTS", 20, 0),
    (Col::Trend, "", 8, 2),
];

/// The columns that fit in `inner` cells, with their widths: the model column as wide as
/// `longest` (12..48; up to 24 of it outranks the optional columns), the trend taking the rest.
fn fit_columns(inner: u16, longest: usize) -> Vec<(Col, u16)> {
    let longest = u16::try_from(longest).unwrap_or(u16::MAX);
    let mut cols: Vec<(Col, u16, u8)> = TABLE
        .iter()
        .map(|&(c, _, w, d)| match c {
            Col::Key(SortKey::Model) => (c, longest.clamp(w, 24), d),
            _ => (c, w, d),
        })
        .collect();
    let need =
        |cols: &[(Col, u16, u8)]| cols.iter().map(|c| c.1 + 1).sum::<u16>().saturating_sub(1);
    while need(&cols) > inner {
        let Some(drop) = cols
            .iter()
            .filter(|c| c.2 > 0)
            .min_by_key(|c| c.2)
            .map(|c| c.0)
        else {
            break;
        };
        cols.retain(|c| c.0 != drop);
    }
    let spare = inner.saturating_sub(need(&cols));
    let has_trend = cols.iter().any(|c| c.0 == Col::Trend);
    let model_w = cols.first().map_or(12, |c| c.1);
    // With a trend column, the model id grows to its length (at most 48) and the trend gets the
    // rest; without one, the model id takes all the spare room.
    let model_extra = if has_trend {
        longest
            .clamp(model_w, 48)
            .saturating_sub(model_w)
            .min(spare)
    } else {
        spare
    };
    cols.into_iter()
        .map(|(c, w, _)| match c {
            Col::Key(SortKey::Model) => (c, w + model_extra),
            Col::Trend => (c, w + spare - model_extra),
            _ => (c, w),
        })
        .collect()
}

pub fn severity_style(severity: Option<&str>) -> Style {
    match severity_rank(severity) {
        0 => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        1 => Style::new().fg(Color::Yellow),
        2 => Style::new().fg(Color::Blue),
        _ => Style::new(),
    }
}

/// Column header text, the label of the sort column carrying ▲ (ascending) or ▼.
fn column_title(state: &TopState, key: SortKey, label: &str) -> String {
    if state.sort != key {
        return label.to_string();
    }
    let descending = (key != SortKey::Model) != state.reverse;
    format!("{label}{}", if descending { "▼" } else { "▲" })
}

fn alert_cell(m: &ModelRow) -> Cell<'static> {
    match (m.alerts_firing, m.alerts_pending) {
        (0, 0) => Cell::from(fmt::MISSING).dim(),
        (0, p) => Cell::from(format!("{p} pending"))
            .style(Style::new().fg(Color::Yellow).add_modifier(Modifier::DIM)),
        (f, p) => {
            let sev = m.worst_severity.as_deref().unwrap_or("firing");
            let text = if p > 0 {
                format!("{f} {sev} +{p} pend")
            } else {
                format!("{f} {sev}")
            };
            Cell::from(text).style(severity_style(m.worst_severity.as_deref()))
        }
    }
}

fn cell(state: &TopState, m: &ModelRow, col: Col, width: u16) -> Cell<'static> {
    let key = match col {
        Col::Trend => {
            return Cell::from(fmt::sparkline(state.trend.series(m), usize::from(width)))
                .fg(Color::Cyan);
        }
        Col::Key(k) => k,
    };
    match key {
        SortKey::Model if m.alerts_firing > 0 => {
            Cell::from(m.model_id.clone()).style(severity_style(m.worst_severity.as_deref()))
        }
        // ʳ: the figures are the runtime's own (see the detail pane).
        SortKey::Model if m.from_runtime() => Cell::from(format!("{} ʳ", m.model_id)),
        SortKey::Model => Cell::from(m.model_id.clone()),
        SortKey::TtftP50 => Cell::from(fmt::latency(m.ttft_p50_s)),
        SortKey::TtftP99 => Cell::from(fmt::latency(m.ttft_p99_s)),
        SortKey::ItlP50 => Cell::from(fmt::latency(m.itl_p50_s)),
        SortKey::ItlP99 => Cell::from(fmt::latency(m.itl_p99_s)),
        SortKey::Requests => Cell::from(fmt::rate(m.requests_per_s)),
        SortKey::Tokens => Cell::from(fmt::rate(m.output_tokens_per_s)),
        SortKey::Errors if m.error_ratio.unwrap_or(0.0) > 0.0 => {
            Cell::from(fmt::percent(m.error_ratio, 1)).fg(Color::Red)
        }
        SortKey::Errors => Cell::from(fmt::percent(m.error_ratio, 1)),
        SortKey::KvCache => Cell::from(fmt::percent(m.kv_cache_usage, 0)),
        SortKey::GpuMemory => Cell::from(fmt::gpu_memory(
            m.gpu_memory_used_bytes,
            m.gpu_memory_total_bytes,
            m.gpu_memory_used_ratio,
        )),
        SortKey::Alerts => alert_cell(m),
    }
}

fn title_of(state: &TopState, col: Col) -> String {
    match col {
        Col::Trend => state.trend.label().to_string(),
        Col::Key(k) => {
            let label = TABLE.iter().find(|c| c.0 == col).map_or("", |c| c.1);
            column_title(state, k, label)
        }
    }
}

fn header(state: &TopState, shown: usize) -> Paragraph<'static> {
    let models = state.models();
    let firing: u64 = models.iter().map(|m| m.alerts_firing).sum();
    let worst = models
        .iter()
        .filter(|m| m.alerts_firing > 0)
        .min_by_key(|m| severity_rank(m.worst_severity.as_deref()))
        .and_then(|m| m.worst_severity.clone());
    let refreshed = state.refreshed_at.map_or(fmt::MISSING.to_string(), |t| {
        t.format("%H:%M:%S").to_string()
    });
    let firing_style = if firing > 0 {
        severity_style(worst.as_deref().or(Some("warning")))
    } else {
        Style::new().fg(Color::Green)
    };
    let top = Line::from(vec![
        Span::from("tokenwatch top").bold().fg(Color::Cyan),
        Span::from(format!(
            "  {}  window {}  models {shown}/{}  ",
            state.url,
            state.window.name(),
            models.len()
        )),
        Span::styled(format!("firing alerts {firing}"), firing_style),
        Span::from(format!(
            "  refreshed {refreshed} (every {} ms)",
            state.interval.as_millis()
        )),
    ]);
    let status = match (&state.error, &state.fleet) {
        (Some(e), Some(_)) => {
            Line::from(format!("✗ {e} — retrying; showing data from {refreshed}")).fg(Color::Red)
        }
        (Some(e), None) => Line::from(format!("✗ {e} — retrying")).fg(Color::Red),
        (None, Some(f)) => Line::from(format!(
            "● connected, data generated {}",
            fmt::clock(f.generated_at_unix_ms)
        ))
        .fg(Color::Green),
        (None, None) => Line::from(format!("connecting to {}…", state.url)).dim(),
    };
    let keys = match &state.filter_input {
        Some(input) => Line::from(vec![
            Span::from("filter model id: ").bold(),
            Span::from(format!("{input}█")).fg(Color::Yellow),
            Span::from("   Enter apply · Esc clear").dim(),
        ]),
        None => {
            let mut spans = Vec::new();
            spans
                .push(Span::from(format!("sort {}", title_of(state, Col::Key(state.sort)))).bold());
            if !state.filter.is_empty() {
                spans.push(Span::from(format!("  filter \"{}\"", state.filter)).fg(Color::Yellow));
            }
            if state.only_alerts {
                spans.push(Span::from("  alerts only").fg(Color::Yellow));
            }
            spans.push(
                Span::from("   q quit · s/S sort · r reverse · / filter · a alerts only · t trend · w window · ↑↓ select · Enter details").dim(),
            );
            Line::from(spans)
        }
    };
    Paragraph::new(vec![top, status, keys])
}

fn table(frame: &mut Frame, area: Rect, state: &mut TopState, visible: &[usize]) {
    let rows_fit = usize::from(area.height.saturating_sub(3));
    state.page_rows = rows_fit.max(1);
    let pos = state.selected_position(visible);
    if let Some(p) = pos {
        if p < state.offset {
            state.offset = p;
        } else if rows_fit > 0 && p >= state.offset + rows_fit {
            state.offset = p + 1 - rows_fit;
        }
    }
    state.offset = state.offset.min(visible.len().saturating_sub(rows_fit));
    let end = (state.offset + rows_fit).min(visible.len());
    let models = state.models();
    let shown = &visible[state.offset..end];
    // The model column is as wide as the longest id shown (within limits); the trend takes the rest.
    let longest = shown
        .iter()
        .map(|&i| models[i].model_id.chars().count() + if models[i].from_runtime() { 2 } else { 0 })
        .max()
        .unwrap_or(0);
    let columns = fit_columns(area.width.saturating_sub(2), longest);
    let rows: Vec<Row> = shown
        .iter()
        .map(|&i| Row::new(columns.iter().map(|&(c, w)| cell(state, &models[i], c, w))))
        .collect();
    let titles: Vec<String> = columns.iter().map(|&(c, _)| title_of(state, c)).collect();
    let title = if visible.is_empty() {
        match state.fleet {
            Some(ref f) if f.models.is_empty() => {
                " no models yet: tokenwatch has not seen traffic ".to_string()
            }
            Some(_) => " no model matches the filter ".to_string(),
            None => " waiting for data ".to_string(),
        }
    } else {
        format!(" models {}–{} of {} ", state.offset + 1, end, visible.len())
    };
    let widths: Vec<Constraint> = columns
        .iter()
        .map(|&(_, w)| Constraint::Length(w))
        .collect();
    let table = Table::new(rows, widths)
        .header(Row::new(titles).bold().underlined())
        .block(Block::bordered().title(title))
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED));
    let mut ts = TableState::default().with_selected(pos.map(|p| p - state.offset));
    frame.render_stateful_widget(table, area, &mut ts);
}

fn detail_lines(state: &TopState) -> (String, Vec<Line<'static>>) {
    let Some(d) = &state.detail else {
        return (String::new(), Vec::new());
    };
    let mut lines = Vec::new();
    if let Some(m) = state.models().iter().find(|m| m.model_id == d.model) {
        let list = |v: &[String]| match v.len() {
            0 => fmt::MISSING.to_string(),
            n if n <= 4 => v.join(", "),
            n => format!("{} +{} more", v[..4].join(", "), n - 4),
        };
        lines.push(Line::from(format!(
            "runtimes {}   instances {}",
            list(&m.runtimes),
            list(&m.instances)
        )));
        if let Some(line) = runtime_beside(m) {
            lines.push(Line::from(line).fg(Color::Cyan));
        }
        if m.from_runtime() {
            lines.push(
                Line::from(
                    "ʳ figures reported by the runtime (scraped histograms: each percentile is within its bucket; no proxy or OTLP record)",
                )
                .fg(Color::Cyan),
            );
        }
        lines.push(Line::from(format!(
            "TTFT p50 {} p99 {}   ITL p50 {} p99 {}   E2E p50 {} p99 {}",
            fmt::latency(m.ttft_p50_s),
            fmt::latency(m.ttft_p99_s),
            fmt::latency(m.itl_p50_s),
            fmt::latency(m.itl_p99_s),
            fmt::latency(m.e2e_p50_s),
            fmt::latency(m.e2e_p99_s),
        )));
        lines.push(Line::from(format!(
            "requests {}   prompt tokens {}   output tokens {}   errors {}   waiting {}   running {}   KV cache {}   GPU memory {}",
            fmt::rate(m.requests_per_s), fmt::rate(m.prompt_tokens_per_s), fmt::rate(m.output_tokens_per_s),
            fmt::percent(m.error_ratio, 1), fmt::count(m.requests_waiting), fmt::count(m.requests_running),
            fmt::percent(m.kv_cache_usage, 0),
            fmt::gpu_memory(m.gpu_memory_used_bytes, m.gpu_memory_total_bytes, m.gpu_memory_used_ratio),
        )));
    }
    match &d.alerts {
        None => lines.push(Line::from("alerts: loading…").dim()),
        Some(Err(e)) => lines.push(Line::from(format!("alerts: {e}")).fg(Color::Red)),
        Some(Ok(alerts)) if alerts.is_empty() => {
            lines.push(Line::from("alerts: none").fg(Color::Green))
        }
        Some(Ok(alerts)) => {
            lines.push(Line::from(format!("alerts ({}):", alerts.len())).bold());
            for a in alerts {
                let since = fmt::clock(a.fired_at_unix_ms.or(a.active_at_unix_ms));
                let style = if a.state == "resolved" {
                    Style::new().dim()
                } else {
                    severity_style(Some(&a.severity))
                };
                lines.push(Line::from(vec![
                    Span::styled(format!("  {:<8} {:<8} ", a.state, a.severity), style),
                    Span::from(format!("{}  since {since}  {}", a.rule, a.summary())),
                ]));
                if let Some(c) = a.root_cause.first().filter(|c| !c.path.is_empty()) {
                    lines.push(
                        Line::from(format!("      root cause: {}", c.path.join(" → ")))
                            .fg(Color::Magenta),
                    );
                }
            }
        }
    }
    (format!(" {} — Enter/Esc close ", d.model), lines)
}

/// Draws the whole screen. Only takes `&mut` to keep the scroll offset and page size current.
pub fn draw(frame: &mut Frame, state: &mut TopState) {
    let visible = state.visible();
    let [head, body] =
        Layout::vertical([Constraint::Length(3), Constraint::Min(0)]).areas(frame.area());
    frame.render_widget(header(state, visible.len()), head);
    if state.detail.is_some() {
        // As tall as its content, leaving the table its header and up to five rows (and, on a
        // long table, two fifths of the screen).
        let (title, lines) = detail_lines(state);
        let content = u16::try_from(lines.len())
            .unwrap_or(u16::MAX)
            .saturating_add(2);
        let table_min = u16::try_from(visible.len().min(5)).unwrap_or(5) + 3;
        let mut detail_h = content.min(body.height.saturating_sub(table_min));
        if visible.len() > 5 {
            detail_h = detail_h.min(body.height * 3 / 5);
        }
        let [tab, det] =
            Layout::vertical([Constraint::Min(0), Constraint::Length(detail_h)]).areas(body);
        table(frame, tab, state, &visible);
        frame.render_widget(
            Paragraph::new(lines).block(Block::bordered().title(title)),
            det,
        );
    } else {
        table(frame, body, state, &visible);
    }
}

/// "runtime reports TTFT p50 … p99 …; in front of it …" for a model the proxy and the runtime
/// both see; None otherwise.
fn runtime_beside(m: &ModelRow) -> Option<String> {
    let p50 = m.runtime_view.get("ttft_p50_s")?;
    let p99 = m.runtime_view.get("ttft_p99_s");
    let mut line = format!(
        "⇄ the runtime reports TTFT p50 {} p99 {}",
        fmt::latency(Some(p50.value)),
        fmt::latency(p99.map(|f| f.value))
    );
    if let Some(gap) = m.client_minus_runtime.get("ttft_p50_s") {
        line.push_str(&format!(
            "; in front of it (p50): {} to {}",
            gap.at_least
                .map_or("−∞".to_string(), |v| fmt::latency(Some(v))),
            fmt::latency(Some(gap.at_most))
        ));
    }
    Some(line)
}
