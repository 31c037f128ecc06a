// Fault specifications: the six fault kinds and parsing of `NAME[:k=v,k=v]` specs (start flag
// and admin endpoint), with each parameter's default and range taken from the catalogue.

mod board;
mod catalog;

pub use board::{ActiveFault, Effects, FaultBoard};
pub use catalog::{COMMON_PARAMS, FAULTS, FaultDoc, ParamDoc, fault_doc, fault_help};

use std::collections::BTreeMap;

use crate::error::SimError;

/// Names accepted by `parse_fault`, in documentation order.
pub fn fault_names() -> Vec<&'static str> {
    FAULTS.iter().map(|f| f.name).collect()
}

/// Hard ceiling on output length when `length_blowup` ignores the default cap.
pub const BLOWUP_HARD_LIMIT: u32 = 8192;

/// What a fault does, with its parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// Every finished request keeps `blocks` KV blocks from the pool for good (and their memory
    /// outside it); the process also leaks `mib_per_s` MiB of GPU memory per second of work.
    KvLeak { blocks: u32, mib_per_s: f64 },
    /// `share` of requests get TTFT and ITL multiplied by `factor`.
    LatencySpike { factor: f64, share: f64 },
    /// Outputs `factor` times longer; only the request's own max_tokens caps them.
    LengthBlowup { factor: f64 },
    /// `rate` of requests fail with HTTP `status` before streaming.
    ErrorBurst { rate: f64, status: u16 },
    /// `rate` of streams stop mid-way for `seconds`, then continue.
    Stall { seconds: f64, rate: f64 },
    /// `share` of responses switch to a different vocabulary (semantic drift).
    Drift { share: f64 },
}

/// A parsed fault: kind, optional target model, optional duration (0 = until disabled).
#[derive(Debug, Clone, PartialEq)]
pub struct FaultSpec {
    pub kind: FaultKind,
    pub model: Option<String>,
    pub duration_s: f64,
}

impl FaultSpec {
    /// The fault's name as used in specs and the admin API.
    pub fn name(&self) -> &'static str {
        match self.kind {
            FaultKind::KvLeak { .. } => "kv_leak",
            FaultKind::LatencySpike { .. } => "latency_spike",
            FaultKind::LengthBlowup { .. } => "length_blowup",
            FaultKind::ErrorBurst { .. } => "error_burst",
            FaultKind::Stall { .. } => "stall",
            FaultKind::Drift { .. } => "drift",
        }
    }

    /// All parameters (defaults filled in) as strings, for display.
    pub fn params(&self) -> BTreeMap<String, String> {
        let pairs: Vec<(&str, String)> = match &self.kind {
            FaultKind::KvLeak { blocks, mib_per_s } => vec![
                ("blocks", blocks.to_string()),
                ("mib_per_s", mib_per_s.to_string()),
            ],
            FaultKind::LatencySpike { factor, share } => {
                vec![("factor", factor.to_string()), ("share", share.to_string())]
            }
            FaultKind::LengthBlowup { factor } => vec![("factor", factor.to_string())],
            FaultKind::ErrorBurst { rate, status } => {
                vec![("rate", rate.to_string()), ("status", status.to_string())]
            }
            FaultKind::Stall { seconds, rate } => {
                vec![("seconds", seconds.to_string()), ("rate", rate.to_string())]
            }
            FaultKind::Drift { share } => vec![("share", share.to_string())],
        };
        let mut p: BTreeMap<String, String> =
            pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        p.insert("duration_s".into(), self.duration_s.to_string());
        if let Some(m) = &self.model {
            p.insert("model".into(), m.clone());
        }
        p
    }

    /// Build a spec from a name and `k=v` parameters (admin JSON form).
    pub fn from_parts(name: &str, params: &[(String, String)]) -> Result<FaultSpec, SimError> {
        let spec_text = render_spec(name, params);
        let err = |reason: String| SimError::InvalidFault {
            spec: spec_text.clone(),
            reason,
        };
        let Some(doc) = fault_doc(name) else {
            return Err(err(format!(
                "unknown fault `{name}`; allowed: {}",
                fault_names().join(", ")
            )));
        };
        let mut p = Params::new(name, params).map_err(err)?;
        let mut v = |key: &'static str| p.value(doc.params, key).map_err(err);
        let kind = match name {
            "kv_leak" => FaultKind::KvLeak {
                blocks: v("blocks")? as u32,
                mib_per_s: v("mib_per_s")?,
            },
            "latency_spike" => FaultKind::LatencySpike {
                factor: v("factor")?,
                share: v("share")?,
            },
            "length_blowup" => FaultKind::LengthBlowup {
                factor: v("factor")?,
            },
            "error_burst" => FaultKind::ErrorBurst {
                rate: v("rate")?,
                status: v("status")? as u16,
            },
            "stall" => FaultKind::Stall {
                seconds: v("seconds")?,
                rate: v("rate")?,
            },
            "drift" => FaultKind::Drift { share: v("share")? },
            other => {
                return Err(err(format!(
                    "fault `{other}` is documented but has no parser; allowed: {}",
                    fault_names().join(", ")
                )));
            }
        };
        let duration_s = p.value(COMMON_PARAMS, "duration_s").map_err(err)?;
        let model = p.take("model").filter(|m| !m.is_empty());
        p.finish().map_err(err)?;
        Ok(FaultSpec {
            kind,
            model,
            duration_s,
        })
    }
}

/// Parse `NAME[:k=v,k=v]`, e.g. `kv_leak:blocks=64,model=sim-llama-8b`.
pub fn parse_fault(spec: &str) -> Result<FaultSpec, SimError> {
    let spec = spec.trim();
    let (name, rest) = spec.split_once(':').unwrap_or((spec, ""));
    let mut params = Vec::new();
    for part in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = part.split_once('=') else {
            return Err(SimError::InvalidFault {
                spec: spec.to_string(),
                reason: format!("parameter `{part}` is not of the form key=value"),
            });
        };
        params.push((k.trim().to_string(), v.trim().to_string()));
    }
    FaultSpec::from_parts(name.trim(), &params)
}

fn render_spec(name: &str, params: &[(String, String)]) -> String {
    let kv: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if kv.is_empty() {
        name.to_string()
    } else {
        format!("{name}:{}", kv.join(","))
    }
}

/// Parameter bag that remembers which keys were consumed, so unknown keys are reported.
struct Params {
    fault: String,
    values: BTreeMap<String, String>,
    allowed: Vec<&'static str>,
}

impl Params {
    fn new(fault: &str, params: &[(String, String)]) -> Result<Params, String> {
        let mut values = BTreeMap::new();
        for (k, v) in params {
            if values.insert(k.clone(), v.clone()).is_some() {
                return Err(format!("parameter `{k}` given twice"));
            }
        }
        Ok(Params {
            fault: fault.to_string(),
            values,
            allowed: vec!["model", "duration_s"],
        })
    }

    fn take(&mut self, key: &'static str) -> Option<String> {
        if !self.allowed.contains(&key) {
            self.allowed.push(key);
        }
        self.values.remove(key)
    }

    /// The parameter `key` as documented in `docs`: its default when absent, else the given
    /// value checked against the documented range (and wholeness for integers).
    fn value(&mut self, docs: &[ParamDoc], key: &'static str) -> Result<f64, String> {
        let Some(d) = docs.iter().find(|d| d.key == key) else {
            return Err(format!(
                "parameter `{key}` of {} is not documented",
                self.fault
            ));
        };
        let Some(raw) = self.take(key) else {
            return Ok(d.default);
        };
        let (min, max) = (d.min, d.max);
        if d.integer {
            return match raw.parse::<u64>() {
                Ok(v) if (min..=max).contains(&(v as f64)) => Ok(v as f64),
                _ => Err(format!(
                    "`{key}={raw}`: expected an integer in {min}..={max}"
                )),
            };
        }
        match raw.parse::<f64>() {
            Ok(v) if v.is_finite() && (min..=max).contains(&v) => Ok(v),
            _ => Err(format!("`{key}={raw}`: expected a number in {min}..={max}")),
        }
    }

    fn finish(self) -> Result<(), String> {
        match self.values.keys().next() {
            None => Ok(()),
            Some(k) => Err(format!(
                "unknown parameter `{k}` for {}; allowed: {}",
                self.fault,
                self.allowed.join(", ")
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(spec: &str) -> String {
        match parse_fault(spec) {
            Err(SimError::InvalidFault { reason, .. }) => reason,
            other => panic!("expected InvalidFault for {spec}, got {other:?}"),
        }
    }

    #[test]
    fn defaults_and_params() {
        let f = parse_fault("kv_leak").unwrap();
        assert_eq!(
            f.kind,
            FaultKind::KvLeak {
                blocks: 48,
                mib_per_s: 64.0
            }
        );
        assert_eq!((f.model, f.duration_s), (None, 0.0));
        let f = parse_fault("latency_spike:factor=5, share=0.5,duration_s=30,model=m1").unwrap();
        assert_eq!(
            f.kind,
            FaultKind::LatencySpike {
                factor: 5.0,
                share: 0.5
            }
        );
        assert_eq!((f.model.as_deref(), f.duration_s), (Some("m1"), 30.0));
        assert_eq!(
            parse_fault("error_burst").unwrap().kind,
            FaultKind::ErrorBurst {
                rate: 0.3,
                status: 503
            }
        );
        assert_eq!(
            parse_fault("stall").unwrap().kind,
            FaultKind::Stall {
                seconds: 5.0,
                rate: 0.2
            }
        );
        assert_eq!(
            parse_fault("length_blowup").unwrap().kind,
            FaultKind::LengthBlowup { factor: 4.0 }
        );
        assert_eq!(
            parse_fault("kv_leak:blocks=64").unwrap().params()["blocks"],
            "64"
        );
    }

    #[test]
    fn errors_name_the_bad_part() {
        let r = reason("kv_lek");
        assert!(
            r.contains("kv_lek") && r.contains("kv_leak, latency_spike"),
            "{r}"
        );
        let r = reason("kv_leak:block=3");
        assert!(r.contains("`block`") && r.contains("blocks"), "{r}");
        let r = reason("latency_spike:share=2");
        assert!(r.contains("share=2") && r.contains("0..=1"), "{r}");
        let r = reason("error_burst:status=404");
        assert!(r.contains("500..=599"), "{r}");
        let r = reason("stall:seconds");
        assert!(r.contains("key=value"), "{r}");
        let r = reason("stall:rate=0.1,rate=0.2");
        assert!(r.contains("twice"), "{r}");
        let e = parse_fault("nope:x=1").unwrap_err().to_string();
        assert!(e.contains("invalid fault spec `nope:x=1`"), "{e}");
    }
}
