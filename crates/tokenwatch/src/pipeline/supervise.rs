// Analysis that panics fails open. The pipeline thread and the alert engine catch a panic of
// their own work (one batch, one evaluation), drop what they had in hand — counted — and go on
// with the next batch: in effect the stage restarts in place, keeping its state (a poisoned
// lock is read through, as everywhere in tokenwatch). The proxy never waits on either (records
// reach them through queues that drop when full), so its streams are not touched; what shows
// the failure is this watch: an error log line (the first panic, then at most one every
// `LOG_EVERY`), `tokenwatch_analysis_panics_total{component}`, and the component's status in
// `/readyz`, which from then on names the panic. `/readyz` stays 200 where the proxy forwards
// (it only names the failure; a load balancer must not take the request path out of rotation
// because analysis failed).

use crate::kernel::telemetry::{ComponentLabels, Metrics};
use crate::sources::Components;
use prometheus_client::metrics::counter::Counter;
use std::any::Any;
use std::time::{Duration, Instant};

/// The shortest time between two log lines about panics of one stage (each is counted).
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The panics of one analysis stage: counted, logged and shown in `/readyz`.
pub struct PanicWatch {
    component: &'static str,
    components: Option<Components>,
    counter: Counter,
    panics: u64,
    lost: u64,
    last_log: Option<Instant>,
}

/// The text of a panic's payload (a `&str` or a `String`, as `panic!` makes them).
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a panic without a message)".into())
}

impl PanicWatch {
    /// The watch of `component` (`pipeline`, `alerting`): its status set to `ok` in
    /// `components` (None: no `/readyz` status, as in unit tests).
    pub fn new(
        component: &'static str,
        components: Option<Components>,
        metrics: &Metrics,
    ) -> PanicWatch {
        let counter = metrics
            .analysis_panics
            .get_or_create(&ComponentLabels {
                component: component.into(),
            })
            .clone();
        if let Some(c) = &components {
            c.set(component, "ok");
        }
        PanicWatch {
            component,
            components,
            counter,
            panics: 0,
            lost: 0,
            last_log: None,
        }
    }

    /// How many panics were caught.
    pub fn panics(&self) -> u64 {
        self.panics
    }

    /// A panic was caught; `lost` records were in hand and are dropped (counted by the caller in
    /// its own drop counter). The stage goes on.
    pub fn caught(&mut self, payload: &(dyn Any + Send), lost: u64) {
        let message = panic_message(payload);
        self.panics += 1;
        self.lost += lost;
        self.counter.inc();
        if let Some(c) = &self.components {
            c.set(
                self.component,
                format!(
                    "error: panicked {} time(s), last: {message}; {} record(s) in hand dropped and counted; it went on with its next batch (requests are not affected)",
                    self.panics, self.lost
                ),
            );
        }
        if self.last_log.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            self.last_log = Some(Instant::now());
            tracing::error!(
                component = self.component,
                panics = self.panics,
                lost_records = lost,
                panic = %message,
                "an analysis stage panicked: the records in hand were dropped (counted); it goes on with its next batch; the proxy forwards as before"
            );
        }
    }

    /// The stage stopped for good (a panic outside its guarded work): shown in `/readyz` and
    /// logged; what it would have received is dropped from now on (counted where it is sent).
    pub fn stopped(&self, why: &str) {
        self.counter.inc();
        if let Some(c) = &self.components {
            c.set(
                self.component,
                format!("error: stopped: {why}; its input is dropped and counted from now on (requests are not affected)"),
            );
        }
        tracing::error!(
            component = self.component,
            why,
            "an analysis stage stopped; the proxy forwards as before"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_panic_is_counted_shown_and_named() {
        let metrics = Metrics::new();
        let components = Components::default();
        let mut w = PanicWatch::new("pipeline", Some(components.clone()), &metrics);
        assert_eq!(components.snapshot()["pipeline"], "ok");
        let payload = std::panic::catch_unwind(|| panic!("boom {}", 7)).unwrap_err();
        w.caught(&*payload, 3);
        w.caught(&*payload, 2);
        assert_eq!(w.panics(), 2);
        let status = &components.snapshot()["pipeline"];
        assert!(
            status.starts_with("error: panicked 2 time(s), last: boom 7; 5 record(s)"),
            "{status}"
        );
        assert!(
            metrics
                .encode()
                .contains("tokenwatch_analysis_panics_total{component=\"pipeline\"} 2")
        );
        assert_eq!(panic_message(&"static"), "static");
    }
}
