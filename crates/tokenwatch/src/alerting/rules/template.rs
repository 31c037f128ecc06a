// Alert templates (`summary`, `description`): the placeholders a rule may use, checked when it
// compiles, and their rendering from an alert's labels and latest event.

use super::RuleSpec;
use std::collections::BTreeMap;
use tokenwatch_core::alert::AnomalyEvent;

/// Placeholders: `{{ labels.X }}`, `{{ value }}`, `{{ evidence.X }}`, `{{ summary }}`, `{{ rule }}`, `{{ severity }}`.
fn placeholders(tpl: &str) -> Result<Vec<(usize, usize, String)>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(start) = tpl[at..].find("{{").map(|i| i + at) {
        let Some(end) = tpl[start..].find("}}").map(|i| i + start) else {
            return Err(format!("unclosed {{{{ at byte {start}"));
        };
        out.push((start, end + 2, tpl[start + 2..end].trim().to_string()));
        at = end + 2;
    }
    Ok(out)
}

pub(super) fn check_template(tpl: &str) -> Result<(), String> {
    for (_, _, key) in placeholders(tpl)? {
        let ok = matches!(key.as_str(), "value" | "summary" | "rule" | "severity")
            || key.strip_prefix("labels.").is_some_and(|k| !k.is_empty())
            || key.strip_prefix("evidence.").is_some_and(|k| !k.is_empty());
        if !ok {
            return Err(format!(
                "unknown placeholder {{{{ {key} }}}}; allowed: labels.<name>, value, evidence.<key>, summary, rule, severity"
            ));
        }
    }
    Ok(())
}

/// Fill a template from the alert's labels and latest event. Missing keys become empty.
pub fn render(
    tpl: &str,
    rule: &RuleSpec,
    labels: &BTreeMap<String, String>,
    event: Option<&AnomalyEvent>,
) -> String {
    render_escaped(tpl, rule, labels, event, |v| v)
}

/// [`render`] for a URL: each value percent-encoded as one path segment or query value.
pub fn render_url(
    tpl: &str,
    rule: &RuleSpec,
    labels: &BTreeMap<String, String>,
    event: Option<&AnomalyEvent>,
) -> String {
    render_escaped(tpl, rule, labels, event, |v| {
        crate::kernel::url::component(&v)
    })
}

fn render_escaped(
    tpl: &str,
    rule: &RuleSpec,
    labels: &BTreeMap<String, String>,
    event: Option<&AnomalyEvent>,
    escape: impl Fn(String) -> String,
) -> String {
    let Ok(slots) = placeholders(tpl) else {
        return tpl.to_string();
    };
    let mut out = String::with_capacity(tpl.len());
    let mut last = 0;
    for (start, end, key) in slots {
        out.push_str(&tpl[last..start]);
        last = end;
        let value = match key.as_str() {
            "summary" => event.map(|e| e.summary.clone()).unwrap_or_default(),
            "rule" => rule.name.clone(),
            "severity" => rule.severity.name().to_string(),
            "value" => event
                .map(|e| {
                    e.evidence
                        .get("value")
                        .map(json_text)
                        .unwrap_or_else(|| format!("{:.3}", e.score))
                })
                .unwrap_or_default(),
            k => {
                if let Some(l) = k.strip_prefix("labels.") {
                    labels.get(l).cloned().unwrap_or_default()
                } else if let Some(ev) = k.strip_prefix("evidence.") {
                    event
                        .and_then(|e| e.evidence.get(ev))
                        .map(json_text)
                        .unwrap_or_default()
                } else {
                    String::new()
                }
            }
        };
        // An empty value between two spaces (a model-level alert has no instance) leaves one.
        if value.is_empty() && out.ends_with(' ') && tpl[last..].starts_with(' ') {
            out.pop();
        }
        out.push_str(&escape(value));
    }
    out.push_str(&tpl[last..]);
    out
}

fn json_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() != 0.0 => format!("{f:.3}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}
