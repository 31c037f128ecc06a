// `tokenwatch top`: a live terminal view of a running tokenwatch's fleet (`--url`), refreshed
// every `--interval`; owns the arguments, terminal setup/restore and the event/refresh loop, and
// `--once`: one screen printed as text (scripts, CI, no terminal needed).

pub mod client;
pub mod fmt;
pub mod model;
pub mod state;
pub mod view;

use anyhow::Context;
use client::{ApiClient, ClientError};
use model::{AlertItem, Fleet};
use ratatui::crossterm::event::{self, Event};
use state::{Action, TopState};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokenwatch_core::window::Window;
use tokio::sync::mpsc;

const MIN_INTERVAL: Duration = Duration::from_millis(200);

#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// API address of the tokenwatch to watch.
    #[arg(long, default_value = "http://127.0.0.1:9464")]
    pub url: String,
    /// Refresh period (at least 200ms), e.g. 1s or 500ms.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Window of the percentiles and rates: 1m, 5m or 1h (`w` cycles it while running).
    #[arg(long, default_value = "1m", value_parser = parse_window)]
    pub window: Window,
    /// Time allowed for each API call.
    #[arg(long, default_value = "5s", value_parser = parse_interval)]
    pub timeout: Duration,
    /// File holding a `read` token, for an API with `auth.tokens_file` (or set TOKENWATCH_TOKEN).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// PEM file of CA certificates trusted for an https:// --url, besides the system's roots.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// Read the fleet once, print the screen as plain text and exit (no terminal needed); exits
    /// non-zero when the API does not answer.
    #[arg(long)]
    pub once: bool,
    /// Columns and rows of the `--once` screen, e.g. 160x40.
    #[arg(long, default_value = "160x40", value_parser = parse_size)]
    pub size: (u16, u16),
}

/// The token from `--token-file` or `TOKENWATCH_TOKEN`, if any (never from the command line
/// itself, where other users of the machine could read it).
fn token(args: &TopArgs) -> anyhow::Result<Option<String>> {
    if let Some(path) = &args.token_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--token-file {}", path.display()))?;
        return Ok(Some(text.trim().to_string()).filter(|t| !t.is_empty()));
    }
    Ok(std::env::var("TOKENWATCH_TOKEN")
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty()))
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = crate::kernel::duration::HumanDuration::parse(s)?.0;
    if d < MIN_INTERVAL {
        return Err(format!("{s:?} is too short: at least 200ms"));
    }
    Ok(d)
}

fn parse_size(s: &str) -> Result<(u16, u16), String> {
    let bad = || format!("{s:?}: expected COLUMNSxROWS, each 20 to 1000, e.g. 160x40");
    let (w, h) = s.split_once('x').ok_or_else(bad)?;
    let (w, h) = (
        w.parse::<u16>().map_err(|_| bad())?,
        h.parse::<u16>().map_err(|_| bad())?,
    );
    if !(20..=1000).contains(&w) || !(20..=1000).contains(&h) {
        return Err(bad());
    }
    Ok((w, h))
}

fn parse_window(s: &str) -> Result<Window, String> {
    Window::parse(s).ok_or_else(|| format!("{s:?}: expected 1m, 5m or 1h"))
}

enum Msg {
    Input(Event),
    InputError(String),
    Fleet(Window, Result<Fleet, ClientError>),
    Alerts(String, Result<Vec<AlertItem>, ClientError>),
}

/// Reads terminal events on a thread of its own until `stop` is set or the loop is gone.
fn spawn_input(
    tx: mpsc::UnboundedSender<Msg>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let msg = match event::poll(Duration::from_millis(100)) {
                Ok(false) => continue,
                Ok(true) => match event::read() {
                    Ok(ev) => Msg::Input(ev),
                    Err(e) => Msg::InputError(e.to_string()),
                },
                Err(e) => Msg::InputError(e.to_string()),
            };
            let fatal = matches!(msg, Msg::InputError(_));
            if tx.send(msg).is_err() || fatal {
                return;
            }
        }
    })
}

/// Runs until q, Esc, Ctrl-C or SIGTERM; the terminal is restored on every way out (a panic
/// included, through ratatui's panic hook).
pub async fn run(args: TopArgs) -> anyhow::Result<()> {
    let mut client = ApiClient::new(&args.url, args.timeout, args.ca_file.as_deref())?;
    if let Some(t) = token(&args)? {
        client = client.with_token(&t)?;
    }
    if args.once {
        let fleet = client
            .fleet(args.window)
            .await
            .with_context(|| format!("reading the fleet from {}", client.base_url()))?;
        let mut state = TopState::new(client.base_url(), args.window, args.interval);
        state.set_fleet(fleet, chrono::Local::now());
        let mut out = String::new();
        for line in screen(&mut state, args.size)? {
            out.push_str(line.trim_end());
            out.push('\n');
        }
        print!("{out}");
        return Ok(());
    }
    let mut terminal =
        ratatui::try_init().context("tokenwatch top needs an interactive terminal")?;
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::unbounded_channel();
    let input = spawn_input(tx.clone(), stop.clone());
    let result = event_loop(&mut terminal, &client, &args, tx, rx).await;
    stop.store(true, Ordering::Relaxed);
    let restored = ratatui::try_restore().context("restoring the terminal");
    let _ = input.join();
    result.and(restored)
}

/// The screen `state` draws at `(columns, rows)`, one string per row.
pub fn screen(state: &mut TopState, (w, h): (u16, u16)) -> anyhow::Result<Vec<String>> {
    let mut term = ratatui::Terminal::new(ratatui::backend::TestBackend::new(w, h))
        .context("an in-memory screen")?;
    term.draw(|f| view::draw(f, state))
        .context("drawing the screen")?;
    let buf = term.backend().buffer();
    Ok((0..h)
        .map(|y| {
            (0..w)
                .filter_map(|x| buf.cell((x, y)).map(|c| c.symbol().to_string()))
                .collect()
        })
        .collect())
}

async fn event_loop(
    terminal: &mut ratatui::DefaultTerminal,
    client: &ApiClient,
    args: &TopArgs,
    tx: mpsc::UnboundedSender<Msg>,
    mut rx: mpsc::UnboundedReceiver<Msg>,
) -> anyhow::Result<()> {
    let mut state = TopState::new(client.base_url(), args.window, args.interval);
    let mut tick = tokio::time::interval(args.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut fleet_in_flight, mut alerts_in_flight) = (false, false);
    let fetch_fleet = |window: Window| {
        let (c, tx) = (client.clone(), tx.clone());
        tokio::spawn(async move {
            let _ = tx.send(Msg::Fleet(window, c.fleet(window).await));
        });
    };
    let fetch_alerts = |model: String| {
        let (c, tx) = (client.clone(), tx.clone());
        tokio::spawn(async move {
            let r = c.alerts(&model).await;
            let _ = tx.send(Msg::Alerts(model, r));
        });
    };
    let signal = crate::app::shutdown_signal();
    tokio::pin!(signal);
    loop {
        terminal
            .draw(|f| view::draw(f, &mut state))
            .context("drawing the screen")?;
        tokio::select! {
            _ = &mut signal => return Ok(()),
            _ = tick.tick() => {
                if !fleet_in_flight {
                    fleet_in_flight = true;
                    fetch_fleet(state.window);
                }
            }
            msg = rx.recv() => match msg {
                None => return Ok(()),
                Some(Msg::InputError(e)) => anyhow::bail!("reading the terminal: {e}"),
                Some(Msg::Input(Event::Key(key))) => match state.on_key(key) {
                    Action::Quit => return Ok(()),
                    Action::Refresh => {
                        if !fleet_in_flight {
                            fleet_in_flight = true;
                            fetch_fleet(state.window);
                        }
                    }
                    Action::FetchAlerts(model) => {
                        alerts_in_flight = true;
                        fetch_alerts(model);
                    }
                    Action::None => {}
                },
                Some(Msg::Input(_)) => {}
                Some(Msg::Fleet(window, result)) => {
                    fleet_in_flight = false;
                    match result {
                        // Data of a window the user has switched away from is dropped.
                        Ok(_) if window != state.window => {}
                        Ok(fleet) => state.set_fleet(fleet, chrono::Local::now()),
                        Err(e) => state.set_error(e.to_string()),
                    }
                    if let Some(model) = state.detail.as_ref().map(|d| d.model.clone())
                        && !alerts_in_flight
                    {
                        alerts_in_flight = true;
                        fetch_alerts(model);
                    }
                }
                Some(Msg::Alerts(model, result)) => {
                    alerts_in_flight = false;
                    state.set_alerts(&model, result.map_err(|e| e.to_string()));
                }
            },
        }
    }
}

#[cfg(test)]
mod tests;
