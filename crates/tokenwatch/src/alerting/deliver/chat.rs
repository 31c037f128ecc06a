// Bodies for receivers that take their own format instead of tokenwatch's webhook body: Slack
// incoming webhooks, Microsoft Teams workflow webhooks (an Adaptive Card) and PagerDuty Events
// API v2. Each names the state and severity, the alert's sentence, its model and replica, the top
// root cause, and links to the alert's page and its runbook. Only what a person acts on is sent:
// firing, and resolved once it fired (never pending).

use super::payload::{RenderOptions, am_sends, root_cause_line, ui_url};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokenwatch_core::alert::{Alert, AlertState, Severity};

/// The body a webhook receiver takes.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum WebhookFormat {
    /// tokenwatch's own body (documented in the `deliver` module), every state change.
    #[default]
    Tokenwatch,
    /// A Slack incoming webhook: `text` and one `section` block of mrkdwn.
    Slack,
    /// A Microsoft Teams workflow ("When a Teams webhook request is received"): a message
    /// with one Adaptive Card.
    Teams,
    /// PagerDuty Events API v2 (`https://events.pagerduty.com/v2/enqueue`): `trigger` when
    /// firing, `resolve` when resolved, deduplicated by the alert's fingerprint.
    Pagerduty,
}

impl WebhookFormat {
    /// Whether a notification of `alert` is sent at all.
    pub(crate) fn sends(self, alert: &Alert) -> bool {
        match self {
            WebhookFormat::Tokenwatch => true,
            _ => am_sends(alert),
        }
    }
}

/// The one line a person reads first: the detector's sentence, else the summary, else the rule.
fn headline(alert: &Alert) -> String {
    alert
        .annotations
        .get("summary")
        .filter(|s| !s.is_empty())
        .or_else(|| alert.last_event.as_ref().map(|e| &e.summary))
        .cloned()
        .unwrap_or_else(|| alert.rule.clone())
}

fn state_word(alert: &Alert) -> &'static str {
    match alert.state {
        AlertState::Resolved => "RESOLVED",
        _ => "FIRING",
    }
}

/// `model-a / 10.0.0.7:8000` (what the alert is about), empty when it names neither.
fn subject(alert: &Alert) -> String {
    ["model_id", "instance"]
        .iter()
        .filter_map(|k| alert.labels.get(*k).filter(|v| !v.is_empty()))
        .cloned()
        .collect::<Vec<_>>()
        .join(" / ")
}

/// Slack's mrkdwn escapes `&`, `<` and `>` (its link syntax).
fn slack_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The body of `format` for `alert`; `routing_key` is PagerDuty's integration key.
pub(crate) fn body(
    format: WebhookFormat,
    alert: &Alert,
    opts: &RenderOptions,
    routing_key: &str,
) -> Value {
    let url = ui_url(&opts.external_url, &alert.id);
    let runbook = alert
        .annotations
        .get("runbook_url")
        .filter(|u| !u.is_empty());
    let cause = root_cause_line(alert);
    let title = format!(
        "[{}:{}] {}{}",
        state_word(alert),
        alert.severity.name(),
        alert.rule,
        match subject(alert) {
            s if s.is_empty() => String::new(),
            s => format!(" on {s}"),
        }
    );
    match format {
        WebhookFormat::Tokenwatch => json!(null),
        WebhookFormat::Slack => {
            let mut lines = vec![
                format!("*{}*", slack_escape(&title)),
                slack_escape(&headline(alert)),
            ];
            if let Some(c) = &cause {
                lines.push(format!("Likely cause: {}", slack_escape(c)));
            }
            let mut links = vec![format!("<{url}|Open in tokenwatch>")];
            if let Some(r) = runbook {
                links.push(format!("<{r}|Runbook>"));
            }
            lines.push(links.join(" · "));
            json!({
                "text": format!("{title}: {}", headline(alert)),
                "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": lines.join("\n")}}],
            })
        }
        WebhookFormat::Teams => {
            let mut body = vec![
                json!({"type": "TextBlock", "text": title, "weight": "Bolder", "size": "Medium", "wrap": true,
                       "color": if alert.state == AlertState::Resolved { "Good" } else if alert.severity == Severity::Critical { "Attention" } else { "Warning" }}),
                json!({"type": "TextBlock", "text": headline(alert), "wrap": true}),
            ];
            if let Some(c) = &cause {
                body.push(json!({"type": "TextBlock", "text": format!("Likely cause: {c}"), "wrap": true, "isSubtle": true}));
            }
            let mut actions =
                vec![json!({"type": "Action.OpenUrl", "title": "Open in tokenwatch", "url": url})];
            if let Some(r) = runbook {
                actions.push(json!({"type": "Action.OpenUrl", "title": "Runbook", "url": r}));
            }
            json!({
                "type": "message",
                "attachments": [{
                    "contentType": "application/vnd.microsoft.card.adaptive",
                    "content": {
                        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                        "type": "AdaptiveCard",
                        "version": "1.4",
                        "body": body,
                        "actions": actions,
                    },
                }],
            })
        }
        WebhookFormat::Pagerduty => {
            // tokenwatch's severities are three of PagerDuty's four, by the same names.
            let severity = alert.severity.name();
            let mut links = vec![json!({"href": url, "text": "Open in tokenwatch"})];
            if let Some(r) = runbook {
                links.push(json!({"href": r, "text": "Runbook"}));
            }
            let event_action = if alert.state == AlertState::Resolved {
                "resolve"
            } else {
                "trigger"
            };
            let mut v = json!({
                "routing_key": routing_key,
                "event_action": event_action,
                "dedup_key": alert.fingerprint,
            });
            if event_action == "trigger" {
                // PagerDuty caps the summary at 1,024 characters.
                let summary: String = format!("{title}: {}", headline(alert))
                    .chars()
                    .take(1024)
                    .collect();
                v["payload"] = json!({
                    "summary": summary,
                    "source": alert.labels.get("instance").filter(|i| !i.is_empty()).cloned().unwrap_or_else(|| "tokenwatch".into()),
                    "severity": severity,
                    "component": alert.labels.get("model_id").cloned().unwrap_or_default(),
                    "class": alert.rule,
                    "group": alert.incident_id.clone().unwrap_or_default(),
                    "custom_details": {
                        "labels": alert.labels,
                        "annotations": alert.annotations,
                        "root_cause": cause,
                        "alert_id": alert.id,
                    },
                });
                v["links"] = json!(links);
                v["client"] = json!("tokenwatch");
                v["client_url"] = json!(url);
            }
            v
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alerting::deliver::payload::tests::alert;

    fn opts() -> RenderOptions {
        RenderOptions {
            external_url: "https://tw.example".into(),
            firing_ttl_ms: 120_000,
        }
    }

    #[test]
    fn pending_is_sent_only_in_tokenwatch_format() {
        let pending = alert(AlertState::Pending);
        assert!(WebhookFormat::Tokenwatch.sends(&pending));
        for f in [
            WebhookFormat::Slack,
            WebhookFormat::Teams,
            WebhookFormat::Pagerduty,
        ] {
            assert!(!f.sends(&pending), "{f:?}");
            assert!(f.sends(&alert(AlertState::Firing)), "{f:?}");
            assert!(f.sends(&alert(AlertState::Resolved)), "{f:?}");
        }
    }

    #[test]
    fn slack_names_state_subject_cause_and_links() {
        let mut a = alert(AlertState::Firing);
        a.annotations
            .insert("runbook_url".into(), "https://wiki/r".into());
        let v = body(WebhookFormat::Slack, &a, &opts(), "");
        let text = v["blocks"][0]["text"]["text"].as_str().unwrap();
        assert!(
            text.starts_with("*[FIRING:critical] ttft_p99_spike on m1*"),
            "{text}"
        );
        assert!(
            text.contains("Likely cause: gpu_memory_leak → kv_cache_pressure"),
            "{text}"
        );
        assert!(
            text.contains(
                "<https://tw.example/#/alerts/a%2F1|Open in tokenwatch> · <https://wiki/r|Runbook>"
            ),
            "{text}"
        );
        assert!(v["text"].as_str().unwrap().starts_with("[FIRING:critical]"));
    }

    #[test]
    fn teams_is_one_adaptive_card_with_actions() {
        let v = body(
            WebhookFormat::Teams,
            &alert(AlertState::Resolved),
            &opts(),
            "",
        );
        let card = &v["attachments"][0];
        assert_eq!(
            card["contentType"],
            "application/vnd.microsoft.card.adaptive"
        );
        assert_eq!(card["content"]["type"], "AdaptiveCard");
        assert!(
            card["content"]["body"][0]["text"]
                .as_str()
                .unwrap()
                .starts_with("[RESOLVED:critical]")
        );
        assert_eq!(
            card["content"]["actions"][0]["url"],
            "https://tw.example/#/alerts/a%2F1"
        );
    }

    #[test]
    fn pagerduty_triggers_and_resolves_by_fingerprint() {
        let t = body(
            WebhookFormat::Pagerduty,
            &alert(AlertState::Firing),
            &opts(),
            "R0UT1NG",
        );
        assert_eq!(t["routing_key"], "R0UT1NG");
        assert_eq!(t["event_action"], "trigger");
        let a = alert(AlertState::Firing);
        assert_eq!(t["dedup_key"], a.fingerprint.as_str());
        assert_eq!(t["payload"]["severity"], "critical");
        assert_eq!(t["payload"]["component"], "m1");
        assert_eq!(t["payload"]["class"], "ttft_p99_spike");
        assert!(t["payload"]["summary"].as_str().unwrap().len() <= 1024);
        assert_eq!(t["links"][0]["href"], "https://tw.example/#/alerts/a%2F1");
        let r = body(
            WebhookFormat::Pagerduty,
            &alert(AlertState::Resolved),
            &opts(),
            "R0UT1NG",
        );
        assert_eq!(r["event_action"], "resolve");
        assert_eq!(r["dedup_key"], t["dedup_key"]);
        assert!(
            r.get("payload").is_none(),
            "a resolve carries no payload: {r}"
        );
    }
}
