// Delivery self-metrics in `/metrics`: notifications by receiver and outcome, delivery latency
// and queue depth per receiver.

use crate::kernel::telemetry::Metrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

const LATENCY_BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Outcomes counted per alert notification.
pub(crate) const OUTCOMES: [&str; 3] = ["sent", "failed", "dropped"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReceiverLabels {
    pub receiver: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OutcomeLabels {
    pub receiver: String,
    pub outcome: String,
}

fn latency_hist() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

#[derive(Clone)]
pub(crate) struct DeliveryMetrics {
    notifications: Family<OutcomeLabels, Counter>,
    latency: Family<ReceiverLabels, Histogram, fn() -> Histogram>,
    queue_depth: Family<ReceiverLabels, Gauge>,
    attempt_failures: Family<ReceiverLabels, Counter>,
}

impl DeliveryMetrics {
    /// Register the families (the encoder adds `_total` to the counter).
    pub(crate) fn register(metrics: &Metrics) -> DeliveryMetrics {
        let m = DeliveryMetrics {
            notifications: Family::default(),
            latency: Family::new_with_constructor(latency_hist),
            queue_depth: Family::default(),
            attempt_failures: Family::default(),
        };
        metrics.register(
            "tokenwatch_alert_notifications",
            "Alert notifications per receiver, by outcome (sent, failed after retries, dropped on a full queue)",
            m.notifications.clone(),
        );
        metrics.register(
            "tokenwatch_alert_notification_latency_seconds",
            "Time from an alert notification being queued to the receiver accepting it",
            m.latency.clone(),
        );
        metrics.register(
            "tokenwatch_alert_notification_failures",
            "Alert notification attempts that failed (connection errors, timeouts, refusals); every retried attempt counts",
            m.attempt_failures.clone(),
        );
        metrics.register(
            "tokenwatch_alert_queue_depth",
            "Notifications waiting in a receiver's queue",
            m.queue_depth.clone(),
        );
        m
    }

    /// Make a receiver's series visible (at zero) before its first notification.
    pub(crate) fn init_receiver(&self, receiver: &str) {
        for o in OUTCOMES {
            self.outcome(receiver, o);
        }
        self.depth(receiver);
        self.attempt_failures(receiver);
    }

    pub(crate) fn attempt_failures(&self, receiver: &str) -> Counter {
        self.attempt_failures
            .get_or_create(&ReceiverLabels {
                receiver: receiver.into(),
            })
            .clone()
    }

    pub(crate) fn outcome(&self, receiver: &str, outcome: &str) -> Counter {
        self.notifications
            .get_or_create(&OutcomeLabels {
                receiver: receiver.into(),
                outcome: outcome.into(),
            })
            .clone()
    }

    pub(crate) fn latency(&self, receiver: &str) -> Histogram {
        self.latency
            .get_or_create(&ReceiverLabels {
                receiver: receiver.into(),
            })
            .clone()
    }

    pub(crate) fn depth(&self, receiver: &str) -> Gauge {
        self.queue_depth
            .get_or_create(&ReceiverLabels {
                receiver: receiver.into(),
            })
            .clone()
    }
}
