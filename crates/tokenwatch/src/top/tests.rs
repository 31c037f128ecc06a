// Tests of the `tokenwatch top` screen: a parsed fleet JSON rendered through ratatui's TestBackend,
// and the keys (sort, reverse, filter, alerts only, selection, detail pane) acting on it.

use super::model::{AlertItem, Fleet};
use super::state::{Action, TopState};
use super::view;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use std::time::Duration;
use tokenwatch_core::window::Window;

const FLEET: &str = r#"{
  "window": "1m", "generated_at_unix_ms": 1764680000000,
  "models": [
    { "model_id": "alpha-7b", "runtimes": ["vllm"], "instances": ["a-1", "a-2"],
      "ttft_p50_s": 0.041, "ttft_p99_s": 0.12, "itl_p50_s": 0.012, "itl_p99_s": 0.03,
      "e2e_p50_s": 1.2, "e2e_p99_s": 3.4, "requests_per_s": 4.1, "prompt_tokens_per_s": 2000.0,
      "output_tokens_per_s": 410.0, "error_ratio": 0.0, "kv_cache_usage": 0.42,
      "requests_waiting": 0, "requests_running": 5,
      "gpu_memory_used_bytes": 65498251264, "gpu_memory_total_bytes": 85899345920, "gpu_memory_used_ratio": 0.76,
      "alerts_firing": 0, "alerts_pending": 0, "worst_severity": null,
      "sparklines": { "t": [1, 2, 3, 4], "ttft_p99_s": [0.1, 0.1, 0.12, 0.12] } },
    { "model_id": "beta-70b", "runtimes": ["sim"], "instances": ["b-1"],
      "ttft_p50_s": 0.35, "ttft_p99_s": 2.5, "itl_p50_s": 0.02, "itl_p99_s": 0.09,
      "requests_per_s": 1.5, "output_tokens_per_s": 90.0, "error_ratio": 0.05, "kv_cache_usage": 0.97,
      "alerts_firing": 2, "alerts_pending": 1, "worst_severity": "critical",
      "sparklines": { "t": [1, 2, 3, 4], "ttft_p99_s": [0.2, 0.4, 1.0, 2.5] } },
    { "model_id": "gamma-1b", "ttft_p50_s": null, "ttft_p99_s": null, "requests_per_s": 0.0,
      "alerts_firing": 0, "alerts_pending": 0, "something_new": true }
  ]
}"#;

fn state() -> TopState {
    let mut s = TopState::new("http://127.0.0.1:9464", Window::M1, Duration::from_secs(1));
    let fleet: Fleet = serde_json::from_str(FLEET).expect("fixture parses");
    s.set_fleet(fleet, chrono::Local::now());
    s
}

fn render(state: &mut TopState, w: u16, h: u16) -> Vec<String> {
    let mut term = Terminal::new(TestBackend::new(w, h)).expect("test terminal");
    term.draw(|f| view::draw(f, state)).expect("draw");
    let buf = term.backend().buffer();
    (0..h)
        .map(|y| {
            (0..w)
                .filter_map(|x| buf.cell((x, y)).map(|c| c.symbol().to_string()))
                .collect()
        })
        .collect()
}

fn key(s: &mut TopState, code: KeyCode) -> Action {
    s.on_key(KeyEvent::new(code, KeyModifiers::NONE))
}

fn typed(s: &mut TopState, text: &str) {
    for c in text.chars() {
        key(s, KeyCode::Char(c));
    }
}

/// The screen line holding `model`, and its index.
fn line_of<'a>(screen: &'a [String], model: &str) -> Option<(usize, &'a str)> {
    screen
        .iter()
        .enumerate()
        .find(|(_, l)| l.contains(model))
        .map(|(i, l)| (i, l.as_str()))
}

fn order(screen: &[String], models: &[&str]) -> Vec<String> {
    let mut found: Vec<(usize, &str)> = models
        .iter()
        .filter_map(|m| line_of(screen, m).map(|(i, _)| (i, *m)))
        .collect();
    found.sort();
    found.into_iter().map(|(_, m)| m.to_string()).collect()
}

#[test]
fn table_shows_models_numbers_with_units_and_alert_badges() {
    let mut s = state();
    let screen = render(&mut s, 200, 30);
    let all = screen.join("\n");
    assert!(
        screen[0].contains("http://127.0.0.1:9464") && screen[0].contains("models 3/3"),
        "{all}"
    );
    assert!(screen[0].contains("firing alerts 2"), "{all}");
    assert!(
        all.contains("MODEL▲"),
        "default sort is by model id, ascending: {all}"
    );
    let (_, alpha) = line_of(&screen, "alpha-7b").expect("alpha row");
    for cell in [
        "41.0 ms",
        "120 ms",
        "12.0 ms",
        "30.0 ms",
        "4.1/s",
        "410/s",
        "0.0%",
        "42%",
        "61.0/80 GiB",
        "▇▇██",
    ] {
        assert!(alpha.contains(cell), "{cell:?} missing from {alpha:?}");
    }
    let (_, beta) = line_of(&screen, "beta-70b").expect("beta row");
    for cell in ["350 ms", "2.50 s", "5.0%", "97%", "2 critical +1 pend"] {
        assert!(beta.contains(cell), "{cell:?} missing from {beta:?}");
    }
    let (_, gamma) = line_of(&screen, "gamma-1b").expect("gamma row");
    assert!(gamma.contains("–") && gamma.contains("0.00/s"), "{gamma:?}");
    assert_eq!(
        order(&screen, &["alpha-7b", "beta-70b", "gamma-1b"]),
        ["alpha-7b", "beta-70b", "gamma-1b"]
    );
}

#[test]
fn sort_keys_cycle_columns_and_reverse() {
    let mut s = state();
    let names = ["alpha-7b", "beta-70b", "gamma-1b"];
    key(&mut s, KeyCode::Char('s'));
    key(&mut s, KeyCode::Char('s'));
    let screen = render(&mut s, 200, 30);
    assert!(
        screen.join("\n").contains("TTFT p99▼"),
        "{}",
        screen.join("\n")
    );
    assert_eq!(
        order(&screen, &names),
        ["beta-70b", "alpha-7b", "gamma-1b"],
        "largest first, unknown last"
    );
    key(&mut s, KeyCode::Char('r'));
    let screen = render(&mut s, 200, 30);
    assert!(screen.join("\n").contains("TTFT p99▲"));
    assert_eq!(
        order(&screen, &names),
        ["alpha-7b", "beta-70b", "gamma-1b"],
        "ascending, unknown still last"
    );
    key(&mut s, KeyCode::Char('S'));
    key(&mut s, KeyCode::Char('S'));
    key(&mut s, KeyCode::Char('S'));
    key(&mut s, KeyCode::Char('r'));
    let screen = render(&mut s, 200, 30);
    assert!(
        screen.join("\n").contains("ALERTS▼"),
        "S wraps backwards to the last column"
    );
    assert_eq!(order(&screen, &names)[0], "beta-70b");
}

#[test]
fn filter_and_alerts_only_hide_rows() {
    let mut s = state();
    key(&mut s, KeyCode::Char('/'));
    typed(&mut s, "ALP");
    let screen = render(&mut s, 200, 30);
    assert!(
        screen.join("\n").contains("filter model id: ALP"),
        "the input is shown while typing"
    );
    key(&mut s, KeyCode::Enter);
    let screen = render(&mut s, 200, 30);
    let all = screen.join("\n");
    assert!(
        all.contains("alpha-7b") && !all.contains("beta-70b") && !all.contains("gamma-1b"),
        "{all}"
    );
    assert!(
        all.contains("filter \"ALP\"") && all.contains("models 1/3"),
        "{all}"
    );
    key(&mut s, KeyCode::Char('/'));
    typed(&mut s, "zzz");
    key(&mut s, KeyCode::Esc);
    assert_eq!(s.filter, "", "Esc while typing clears the filter");
    assert_eq!(key(&mut s, KeyCode::Char('a')), Action::None);
    let all = render(&mut s, 200, 30).join("\n");
    assert!(
        all.contains("beta-70b") && !all.contains("alpha-7b") && all.contains("alerts only"),
        "{all}"
    );
    key(&mut s, KeyCode::Char('/'));
    typed(&mut s, "alpha");
    key(&mut s, KeyCode::Enter);
    assert!(
        render(&mut s, 200, 30)
            .join("\n")
            .contains("no model matches the filter")
    );
}

#[test]
fn errors_show_in_the_header_and_keep_the_last_data() {
    let mut s = state();
    s.set_error(
        "cannot reach http://127.0.0.1:9464/api/v1/fleet?window=1m: connection refused".into(),
    );
    let all = render(&mut s, 200, 30).join("\n");
    assert!(
        all.contains("✗ cannot reach") && all.contains("retrying; showing data from"),
        "{all}"
    );
    assert!(all.contains("alpha-7b") && all.contains("41.0 ms"), "{all}");
    let mut empty = TopState::new("http://x:1", Window::M5, Duration::from_secs(1));
    empty.set_error("cannot reach http://x:1: refused".into());
    let all = render(&mut empty, 120, 20).join("\n");
    assert!(
        all.contains("✗ cannot reach http://x:1: refused — retrying")
            && all.contains("waiting for data"),
        "{all}"
    );
}

#[test]
fn quit_keys_and_esc_closing_the_detail_pane() {
    let mut s = state();
    assert_eq!(key(&mut s, KeyCode::Char('q')), Action::Quit);
    assert_eq!(key(&mut s, KeyCode::Esc), Action::Quit);
    assert_eq!(
        s.on_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
        Action::Quit
    );
    assert_eq!(
        key(&mut s, KeyCode::Enter),
        Action::FetchAlerts("alpha-7b".into())
    );
    assert_eq!(
        key(&mut s, KeyCode::Esc),
        Action::None,
        "Esc closes the pane first"
    );
    assert!(s.detail.is_none());
    assert_eq!(key(&mut s, KeyCode::Char('w')), Action::Refresh);
    assert_eq!(s.window, Window::M5);
}

#[test]
fn detail_pane_shows_the_selected_models_alerts() {
    let mut s = state();
    key(&mut s, KeyCode::Down);
    assert_eq!(
        key(&mut s, KeyCode::Enter),
        Action::FetchAlerts("beta-70b".into())
    );
    let all = render(&mut s, 200, 40).join("\n");
    assert!(
        all.contains("beta-70b — Enter/Esc close") && all.contains("alerts: loading"),
        "{all}"
    );
    let alerts: Vec<AlertItem> = serde_json::from_str(
        r#"[{"rule":"ttft_p99_spike","severity":"critical","state":"firing","fired_at_unix_ms":1764680000000,
             "annotations":{"summary":"TTFT P99 of beta-70b is 2.5 s, 6x its baseline"},
             "root_cause":[{"path":["gpu_memory_leak","kv_cache_pressure","latency_spike"],"summary":"leak"}]}]"#,
    )
    .expect("alerts parse");
    s.set_alerts("alpha-7b", Ok(Vec::new()));
    assert!(
        matches!(s.detail.as_ref().map(|d| &d.alerts), Some(None)),
        "alerts of another model are ignored"
    );
    s.set_alerts("beta-70b", Ok(alerts));
    let all = render(&mut s, 200, 40).join("\n");
    for text in [
        "firing",
        "ttft_p99_spike",
        "6x its baseline",
        "gpu_memory_leak → kv_cache_pressure → latency_spike",
        "E2E p50",
    ] {
        assert!(all.contains(text), "{text:?} missing: {all}");
    }
    assert_eq!(
        key(&mut s, KeyCode::Up),
        Action::FetchAlerts("alpha-7b".into()),
        "the pane follows the selection"
    );
}

#[test]
fn a_thousand_models_render_only_the_rows_that_fit() {
    let models: Vec<serde_json::Value> = (0..1000)
        .map(|i| serde_json::json!({ "model_id": format!("model-{i:04}"), "ttft_p99_s": f64::from(i) / 1000.0, "requests_per_s": 1.0 }))
        .collect();
    let mut s = TopState::new("http://x:1", Window::M1, Duration::from_secs(1));
    let fleet: Fleet =
        serde_json::from_value(serde_json::json!({ "models": models })).expect("parses");
    s.set_fleet(fleet, chrono::Local::now());
    let started = std::time::Instant::now();
    let screen = render(&mut s, 200, 50);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "rendering took {:?}",
        started.elapsed()
    );
    let all = screen.join("\n");
    assert!(
        all.contains("models 1–44 of 1000")
            && all.contains("model-0043")
            && !all.contains("model-0044"),
        "{all}"
    );
    key(&mut s, KeyCode::End);
    let all = render(&mut s, 200, 50).join("\n");
    assert!(
        all.contains("models 957–1000 of 1000") && all.contains("model-0999"),
        "{all}"
    );
    key(&mut s, KeyCode::PageUp);
    assert_eq!(
        s.selected.as_deref(),
        Some("model-0955"),
        "PageUp moves one page of 44 rows"
    );
}

#[test]
fn small_terminals_still_draw() {
    let mut s = state();
    key(&mut s, KeyCode::Enter);
    for (w, h) in [(80, 24), (40, 10), (10, 3), (1, 1)] {
        let screen = render(&mut s, w, h);
        assert_eq!(screen.len(), usize::from(h));
    }
    let all = render(&mut s, 80, 24).join("\n");
    assert!(
        all.contains("alpha-7b") && all.contains("tokenwatch top"),
        "{all}"
    );
    // 80 columns: the trend and the less important columns make room for the key ones.
    s.detail = None;
    let screen = render(&mut s, 80, 24);
    let (_, beta) = line_of(&screen, "beta-70b").expect("beta row");
    for cell in ["2.50 s", "1.5/s", "2 critical +1 pend"] {
        assert!(
            beta.contains(cell),
            "{cell:?} missing at 80 columns: {beta:?}"
        );
    }
    assert!(
        !screen.join("\n").contains("p99 trend"),
        "the trend column goes first"
    );
}

#[test]
fn runtime_figures_are_marked_in_the_table_and_explained_in_the_detail_pane() {
    let fleet = r#"{ "window": "1m", "models": [
      { "model_id": "scraped-only", "ttft_p50_s": 0.09, "requests_per_s": 2.0, "figure_source": "runtime" },
      { "model_id": "proxied", "ttft_p50_s": 0.05, "requests_per_s": 1.0, "figure_source": "proxy" } ] }"#;
    let mut s = TopState::new("http://127.0.0.1:9464", Window::M1, Duration::from_secs(1));
    s.set_fleet(
        serde_json::from_str(fleet).expect("parses"),
        chrono::Local::now(),
    );
    let screen = render(&mut s, 160, 20);
    let (_, line) = line_of(&screen, "scraped-only").expect("row");
    assert!(line.contains("scraped-only ʳ"), "{line}");
    let (_, line) = line_of(&screen, "proxied").expect("row");
    assert!(!line.contains('ʳ'), "{line}");
    // The detail pane of the runtime model says where its figures come from.
    while !matches!(key(&mut s, KeyCode::Enter), Action::FetchAlerts(m) if m == "scraped-only") {
        key(&mut s, KeyCode::Esc);
        key(&mut s, KeyCode::Down);
    }
    let all = render(&mut s, 200, 40).join("\n");
    assert!(all.contains("reported by the runtime"), "{all}");
}

#[test]
fn where_proxy_and_runtime_both_see_a_model_the_detail_pane_shows_the_runtimes_view() {
    let fleet = r#"{ "window": "1m", "models": [
      { "model_id": "both", "ttft_p50_s": 0.07, "ttft_p99_s": 0.2, "figure_source": "proxy",
        "runtime_view": { "ttft_p50_s": {"value": 0.05, "bucket": {"lower": 0.04, "upper": 0.06}},
                          "ttft_p99_s": {"value": 0.18, "bucket": {"lower": 0.1, "upper": 0.25}} },
        "client_minus_runtime": { "ttft_p50_s": {"value": 0.02, "at_least": 0.01, "at_most": 0.03} } } ] }"#;
    let mut s = TopState::new("http://127.0.0.1:9464", Window::M1, Duration::from_secs(1));
    s.set_fleet(
        serde_json::from_str(fleet).expect("parses"),
        chrono::Local::now(),
    );
    assert!(matches!(key(&mut s, KeyCode::Enter), Action::FetchAlerts(m) if m == "both"));
    let all = render(&mut s, 200, 40).join("\n");
    assert!(all.contains("the runtime reports TTFT p50"), "{all}");
    assert!(all.contains("in front of it"), "{all}");
}

#[test]
fn once_screens_are_sized_columns_by_rows() {
    assert_eq!(super::parse_size("160x40"), Ok((160, 40)));
    for bad in ["160", "10x40", "160x2000", "axb", "160x"] {
        assert!(super::parse_size(bad).is_err(), "{bad}");
    }
    let mut s = state();
    let lines = super::screen(&mut s, (120, 30)).unwrap();
    assert_eq!(lines.len(), 30);
    assert!(lines.iter().all(|l| l.chars().count() == 120));
    assert_eq!(
        lines,
        render(&mut s, 120, 30),
        "the screen the live view draws"
    );
}
