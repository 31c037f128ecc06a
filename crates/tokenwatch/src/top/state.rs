// State of the `tokenwatch top` screen and what each key does to it: latest fleet data, last
// error, sort column and direction, filter, alerts-only, selection and the detail pane.

use super::model::{AlertItem, Fleet, ModelRow, severity_rank};
use chrono::{DateTime, Local};
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use std::cmp::Ordering;
use std::time::Duration;
use tokenwatch_core::window::Window;

/// Table columns that can sort the rows (`s` / `S` cycle through them in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    Model,
    TtftP50,
    TtftP99,
    ItlP50,
    ItlP99,
    Requests,
    Tokens,
    Errors,
    KvCache,
    GpuMemory,
    Alerts,
}

impl SortKey {
    pub const ALL: [SortKey; 11] = [
        SortKey::Model,
        SortKey::TtftP50,
        SortKey::TtftP99,
        SortKey::ItlP50,
        SortKey::ItlP99,
        SortKey::Requests,
        SortKey::Tokens,
        SortKey::Errors,
        SortKey::KvCache,
        SortKey::GpuMemory,
        SortKey::Alerts,
    ];

    fn position(self) -> usize {
        SortKey::ALL.iter().position(|k| *k == self).unwrap_or(0)
    }

    pub fn next(self) -> SortKey {
        SortKey::ALL[(self.position() + 1) % SortKey::ALL.len()]
    }

    pub fn prev(self) -> SortKey {
        SortKey::ALL[(self.position() + SortKey::ALL.len() - 1) % SortKey::ALL.len()]
    }

    /// Model ids read best A→Z; every number reads best largest first.
    fn descending_by_default(self) -> bool {
        self != SortKey::Model
    }

    /// The numeric sort value of a row (None sorts last); Model sorts by name instead.
    fn value(self, m: &ModelRow) -> Option<f64> {
        match self {
            SortKey::Model => None,
            SortKey::TtftP50 => m.ttft_p50_s,
            SortKey::TtftP99 => m.ttft_p99_s,
            SortKey::ItlP50 => m.itl_p50_s,
            SortKey::ItlP99 => m.itl_p99_s,
            SortKey::Requests => m.requests_per_s,
            SortKey::Tokens => m.output_tokens_per_s,
            SortKey::Errors => m.error_ratio,
            SortKey::KvCache => m.kv_cache_usage,
            SortKey::GpuMemory => m.gpu_ratio().or(m.gpu_memory_used_bytes),
            // Firing outranks pending; a worse severity outranks more alerts of a milder one.
            SortKey::Alerts => Some(
                (3.0 - f64::from(severity_rank(m.worst_severity.as_deref()))) * 1e12
                    + m.alerts_firing as f64 * 1e6
                    + m.alerts_pending as f64,
            ),
        }
    }
}

/// Which series the trend column draws (`t` cycles).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trend {
    TtftP99,
    ItlP99,
    Requests,
    KvCache,
    GpuMemory,
}

impl Trend {
    pub fn next(self) -> Trend {
        match self {
            Trend::TtftP99 => Trend::ItlP99,
            Trend::ItlP99 => Trend::Requests,
            Trend::Requests => Trend::KvCache,
            Trend::KvCache => Trend::GpuMemory,
            Trend::GpuMemory => Trend::TtftP99,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Trend::TtftP99 => "TTFT p99 trend",
            Trend::ItlP99 => "ITL p99 trend",
            Trend::Requests => "req/s trend",
            Trend::KvCache => "KV % trend",
            Trend::GpuMemory => "GPU mem trend",
        }
    }

    pub fn series(self, m: &ModelRow) -> &[Option<f64>] {
        let s = &m.sparklines;
        match self {
            Trend::TtftP99 => &s.ttft_p99_s,
            Trend::ItlP99 => &s.itl_p99_s,
            Trend::Requests => &s.requests_per_s,
            Trend::KvCache => &s.kv_cache_usage,
            Trend::GpuMemory => &s.gpu_memory_used_bytes,
        }
    }
}

/// What the run loop must do after a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    None,
    Quit,
    /// Fetch the fleet again now (the window changed).
    Refresh,
    /// Fetch the alerts of this model for the detail pane.
    FetchAlerts(String),
}

/// Alerts shown in the detail pane, for one model.
#[derive(Debug, Clone)]
pub struct Detail {
    pub model: String,
    pub alerts: Option<Result<Vec<AlertItem>, String>>,
}

#[derive(Debug)]
pub struct TopState {
    pub url: String,
    pub window: Window,
    pub interval: Duration,
    pub fleet: Option<Fleet>,
    pub refreshed_at: Option<DateTime<Local>>,
    /// Last fetch error; cleared by the next successful fetch.
    pub error: Option<String>,
    pub sort: SortKey,
    pub reverse: bool,
    pub filter: String,
    /// The filter being typed after `/` (Enter applies, Esc clears).
    pub filter_input: Option<String>,
    pub only_alerts: bool,
    pub trend: Trend,
    /// Selected model id, so the selection survives refreshes and re-sorting.
    pub selected: Option<String>,
    pub detail: Option<Detail>,
    /// First visible table row and how many fit (kept up to date by the view).
    pub offset: usize,
    pub page_rows: usize,
}

impl TopState {
    pub fn new(url: &str, window: Window, interval: Duration) -> TopState {
        TopState {
            url: url.to_string(),
            window,
            interval,
            fleet: None,
            refreshed_at: None,
            error: None,
            sort: SortKey::Model,
            reverse: false,
            filter: String::new(),
            filter_input: None,
            only_alerts: false,
            trend: Trend::TtftP99,
            selected: None,
            detail: None,
            offset: 0,
            page_rows: 20,
        }
    }

    pub fn set_fleet(&mut self, fleet: Fleet, at: DateTime<Local>) {
        self.fleet = Some(fleet);
        self.refreshed_at = Some(at);
        self.error = None;
    }

    /// A failed fetch: the last data stays on screen, the error goes in the header.
    pub fn set_error(&mut self, error: String) {
        self.error = Some(error);
    }

    pub fn models(&self) -> &[ModelRow] {
        self.fleet.as_ref().map_or(&[], |f| f.models.as_slice())
    }

    /// Rows shown, as indices into `models()`: filtered, then sorted (None last, ties by id).
    pub fn visible(&self) -> Vec<usize> {
        let needle = self.filter.to_lowercase();
        let models = self.models();
        let mut rows: Vec<usize> = (0..models.len())
            .filter(|&i| needle.is_empty() || models[i].model_id.to_lowercase().contains(&needle))
            .filter(|&i| {
                !self.only_alerts || models[i].alerts_firing + models[i].alerts_pending > 0
            })
            .collect();
        let descending = self.sort.descending_by_default() != self.reverse;
        let key = self.sort;
        rows.sort_by(|&a, &b| {
            let (ma, mb) = (&models[a], &models[b]);
            let by_value = match (key.value(ma), key.value(mb)) {
                (Some(x), Some(y)) => {
                    let o = x.partial_cmp(&y).unwrap_or(Ordering::Equal);
                    if descending { o.reverse() } else { o }
                }
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => Ordering::Equal,
            };
            let by_name = ma.model_id.cmp(&mb.model_id);
            let by_name = if key == SortKey::Model && descending {
                by_name.reverse()
            } else {
                by_name
            };
            by_value.then(by_name)
        });
        rows
    }

    /// Position of the selection among `visible`, selecting the first row when it is gone.
    pub fn selected_position(&mut self, visible: &[usize]) -> Option<usize> {
        let models = self.fleet.as_ref().map_or(&[][..], |f| f.models.as_slice());
        let found = self
            .selected
            .as_ref()
            .and_then(|id| visible.iter().position(|&i| models[i].model_id == *id));
        match found {
            Some(p) => Some(p),
            None => {
                self.selected = visible.first().map(|&i| models[i].model_id.clone());
                visible.first().map(|_| 0)
            }
        }
    }

    pub fn selected_row(&self) -> Option<&ModelRow> {
        let id = self.selected.as_ref()?;
        self.models().iter().find(|m| m.model_id == *id)
    }

    fn move_selection(&mut self, delta: isize) -> Action {
        let visible = self.visible();
        let Some(pos) = self.selected_position(&visible) else {
            return Action::None;
        };
        let last = visible.len().saturating_sub(1) as isize;
        let to = (pos as isize + delta).clamp(0, last) as usize;
        let id = self.models()[visible[to]].model_id.clone();
        let changed = self.selected.as_deref() != Some(id.as_str());
        self.selected = Some(id.clone());
        match &mut self.detail {
            Some(d) if changed => {
                *d = Detail {
                    model: id.clone(),
                    alerts: None,
                };
                Action::FetchAlerts(id)
            }
            _ => Action::None,
        }
    }

    pub fn on_key(&mut self, key: KeyEvent) -> Action {
        if key.kind == KeyEventKind::Release {
            return Action::None;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Action::Quit;
        }
        if let Some(input) = &mut self.filter_input {
            match key.code {
                KeyCode::Enter => {
                    self.filter = std::mem::take(input);
                    self.filter_input = None;
                }
                KeyCode::Esc => {
                    self.filter.clear();
                    self.filter_input = None;
                }
                KeyCode::Backspace => {
                    input.pop();
                }
                KeyCode::Char(c) => input.push(c),
                _ => {}
            }
            return Action::None;
        }
        let page = self.page_rows.max(1) as isize;
        match key.code {
            KeyCode::Char('q') => Action::Quit,
            KeyCode::Esc if self.detail.is_some() => {
                self.detail = None;
                Action::None
            }
            KeyCode::Esc => Action::Quit,
            KeyCode::Char('s') => {
                self.sort = self.sort.next();
                Action::None
            }
            KeyCode::Char('S') => {
                self.sort = self.sort.prev();
                Action::None
            }
            KeyCode::Char('r') => {
                self.reverse = !self.reverse;
                Action::None
            }
            KeyCode::Char('/') => {
                self.filter_input = Some(self.filter.clone());
                Action::None
            }
            KeyCode::Char('a') => {
                self.only_alerts = !self.only_alerts;
                Action::None
            }
            KeyCode::Char('t') => {
                self.trend = self.trend.next();
                Action::None
            }
            KeyCode::Char('w') => {
                let i = Window::ALL
                    .iter()
                    .position(|w| *w == self.window)
                    .unwrap_or(0);
                self.window = Window::ALL[(i + 1) % Window::ALL.len()];
                Action::Refresh
            }
            KeyCode::Up | KeyCode::Char('k') => self.move_selection(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_selection(1),
            KeyCode::PageUp => self.move_selection(-page),
            KeyCode::PageDown => self.move_selection(page),
            KeyCode::Home => self.move_selection(isize::MIN / 2),
            KeyCode::End => self.move_selection(isize::MAX / 2),
            KeyCode::Enter if self.detail.is_some() => {
                self.detail = None;
                Action::None
            }
            KeyCode::Enter => {
                let visible = self.visible();
                if self.selected_position(&visible).is_none() {
                    return Action::None;
                }
                match self.selected.clone() {
                    Some(model) => {
                        self.detail = Some(Detail {
                            model: model.clone(),
                            alerts: None,
                        });
                        Action::FetchAlerts(model)
                    }
                    None => Action::None,
                }
            }
            _ => Action::None,
        }
    }

    /// Alerts arrived for the detail pane (ignored when it shows another model by now).
    pub fn set_alerts(&mut self, model: &str, alerts: Result<Vec<AlertItem>, String>) {
        if let Some(d) = &mut self.detail
            && d.model == model
        {
            d.alerts = Some(alerts);
        }
    }
}
