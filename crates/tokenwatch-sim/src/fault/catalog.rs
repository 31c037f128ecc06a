// The fault catalogue: what each fault does, its parameters with defaults and ranges. The spec
// parser reads its defaults from here and `tokenwatch sim --help` prints it, so the two agree.

use std::fmt::Write;

/// One numeric parameter of a fault.
#[derive(Debug, Clone, Copy)]
pub struct ParamDoc {
    pub key: &'static str,
    pub default: f64,
    pub min: f64,
    pub max: f64,
    /// Whole numbers only.
    pub integer: bool,
    pub help: &'static str,
}

/// One fault kind as documented.
#[derive(Debug, Clone, Copy)]
pub struct FaultDoc {
    pub name: &'static str,
    pub help: &'static str,
    pub params: &'static [ParamDoc],
}

const fn num(key: &'static str, default: f64, min: f64, max: f64, help: &'static str) -> ParamDoc {
    ParamDoc {
        key,
        default,
        min,
        max,
        integer: false,
        help,
    }
}

const fn int(key: &'static str, default: f64, min: f64, max: f64, help: &'static str) -> ParamDoc {
    ParamDoc {
        key,
        default,
        min,
        max,
        integer: true,
        help,
    }
}

/// Every fault, in documentation order.
pub const FAULTS: &[FaultDoc] = &[
    FaultDoc {
        name: "kv_leak",
        help: "The serving process stops freeing KV-cache memory (the seed incident: GPU memory \
               climbing 12 GB -> 23 GB while the engine starves). KV blocks run out, so requests \
               queue and get preempted, and the GPU's used memory (DCGM_FI_DEV_FB_USED, the \
               process's memory in /admin/state) climbs steadily until the fault is switched off \
               or the GPU is full. Switching it off frees everything (like a restart).",
        params: &[
            int(
                "blocks",
                48.0,
                1.0,
                1_048_576.0,
                "KV blocks each finished request never returns to the pool; their memory \
                 (blocks x block size) also stays allocated outside the pool",
            ),
            num(
                "mib_per_s",
                64.0,
                0.0,
                65_536.0,
                "GPU memory (MiB) the process leaks per second while it has requests to serve, \
                 whatever its throughput (0 = only the per-request blocks)",
            ),
        ],
    },
    FaultDoc {
        name: "latency_spike",
        help: "A share of requests get their time to first token and inter-token latency multiplied.",
        params: &[
            num("factor", 10.0, 1.0, 1000.0, "latency multiplier"),
            num("share", 0.3, 0.0, 1.0, "fraction of requests affected"),
        ],
    },
    FaultDoc {
        name: "length_blowup",
        help: "Outputs get longer; the default --max-tokens cap is lifted (only a request's own \
               max_tokens and the 8192-token hard limit remain).",
        params: &[num("factor", 4.0, 1.0, 100.0, "output length multiplier")],
    },
    FaultDoc {
        name: "error_burst",
        help: "A share of requests fail with an HTTP 5xx before streaming.",
        params: &[
            num("rate", 0.3, 0.0, 1.0, "fraction of requests that fail"),
            int("status", 503.0, 500.0, 599.0, "HTTP status of the failures"),
        ],
    },
    FaultDoc {
        name: "stall",
        help: "A share of streams stop mid-way for a while, then continue.",
        params: &[
            num("seconds", 5.0, 0.0, 3600.0, "length of each stall"),
            num("rate", 0.2, 0.0, 1.0, "fraction of streams that stall"),
        ],
    },
    FaultDoc {
        name: "drift",
        help: "A share of responses switch to a different vocabulary (semantic drift).",
        params: &[num("share", 1.0, 0.0, 1.0, "fraction of responses drifted")],
    },
];

/// Parameters every fault accepts.
pub const COMMON_PARAMS: &[ParamDoc] = &[num(
    "duration_s",
    0.0,
    0.0,
    1e9,
    "switch the fault off by itself after this many seconds (0 = until disabled)",
)];

/// The documentation entry of `name`.
pub fn fault_doc(name: &str) -> Option<&'static FaultDoc> {
    FAULTS.iter().find(|f| f.name == name)
}

fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn param_line(out: &mut String, p: &ParamDoc) {
    let _ = writeln!(
        out,
        "      {}={}  ({}..={}{}) {}",
        p.key,
        number(p.default),
        number(p.min),
        number(p.max),
        if p.integer { ", integer" } else { "" },
        p.help
    );
}

/// Long help of `--fault`: syntax, then each fault with its parameters and defaults.
pub fn fault_help() -> String {
    let mut out = String::from(
        "Fault to enable at start, `NAME[:k=v,k=v]`; repeatable. The same specs can be switched on \
         and off at run time (POST /admin/faults {\"spec\": \"...\"}, DELETE /admin/faults/NAME).\n\
         Every fault also takes `model=NAME` (only that model; default: all) and:\n",
    );
    for p in COMMON_PARAMS {
        param_line(&mut out, p);
    }
    out.push_str("\nFaults (parameter=default  (range) meaning):\n");
    for f in FAULTS {
        let _ = writeln!(out, "\n  {}: {}", f.name, f.help);
        for p in f.params {
            param_line(&mut out, p);
        }
    }
    out.push_str("\nExample: --fault kv_leak:blocks=24,mib_per_s=32,model=sim-llama-8b");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_lists_every_fault_with_its_defaults() {
        let h = fault_help();
        for f in FAULTS {
            assert!(h.contains(&format!("  {}: ", f.name)), "{}", f.name);
            for p in f.params {
                let shown = format!("{}={}  (", p.key, number(p.default));
                assert!(h.contains(&shown), "{} {shown}", f.name);
            }
        }
        assert!(h.contains("duration_s=0  (0..=1000000000)"), "{h}");
        assert!(h.contains("mib_per_s=64"), "{h}");
        assert!(h.contains("status=503  (500..=599, integer)"), "{h}");
    }

    #[test]
    fn defaults_lie_in_their_ranges() {
        for p in FAULTS.iter().flat_map(|f| f.params).chain(COMMON_PARAMS) {
            assert!((p.min..=p.max).contains(&p.default), "{}", p.key);
            assert!(!p.integer || p.default.fract() == 0.0, "{}", p.key);
        }
    }
}
