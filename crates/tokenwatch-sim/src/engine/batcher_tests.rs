// Unit tests of the batcher, driven with virtual time (no sleeping): batch-size
// dependent ITL, queueing, KV preemption, leak, and the per-request faults.

use super::*;
use crate::fault::parse_fault;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

fn config() -> EngineConfig {
    EngineConfig {
        model: "m".into(),
        gpu_index: 0,
        max_num_seqs: 32,
        kv_blocks: 4096,
        block_size: 16,
        max_model_len: 8192,
        ttft_ms: 10.0,
        itl_ms: 10.0,
        batch_slowdown: 0.03,
        prefill_ms_per_token: 0.0,
        speed_drift: 0.0,
        speed_drift_period_s: 600.0,
        default_max_tokens: 256,
        seed: 1,
        gpu_total_bytes: 80 << 30,
        weights_bytes: 16 << 30,
        block_bytes: 2 << 20,
    }
}

fn core_with(cfg: EngineConfig, faults: &[&str]) -> EngineCore {
    let board = Arc::new(FaultBoard::default());
    for f in faults {
        board.enable(parse_fault(f).unwrap());
    }
    EngineCore::new(Arc::new(cfg), board)
}

/// Submit a request; `target` forces its output length (bypassing the random draw).
fn submit(
    core: &mut EngineCore,
    prompt: u32,
    target: Option<u32>,
    now: Instant,
) -> UnboundedReceiver<SeqEvent> {
    let (tx, rx) = unbounded_channel();
    let req = SubmitRequest {
        prompt_tokens: prompt,
        prefix_hashes: vec![],
        max_tokens: None,
        reasoning_tokens: 0,
        events: tx,
    };
    core.submit(req, now);
    if let (Some(t), Some(seq)) = (target, core.waiting.back_mut()) {
        seq.target = t;
        seq.finish_reason = FinishReason::Length;
        if let Some(at) = seq.stall_at {
            seq.stall_at = Some(at.min(t - 1).max(1));
        }
    }
    rx
}

/// Run steps until nothing runs; returns the final virtual time.
fn run_idle(core: &mut EngineCore, mut now: Instant) -> Instant {
    for _ in 0..1_000_000 {
        core.schedule(now);
        match core.next_wake(now) {
            None => return now,
            Some(t) => {
                now = t;
                core.advance(now);
            }
        }
    }
    panic!("engine did not go idle");
}

fn drain(rx: &mut UnboundedReceiver<SeqEvent>) -> Vec<SeqEvent> {
    let mut out = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        out.push(ev);
    }
    out
}

fn stats(core: &EngineCore) -> EngineStats {
    core.stats_handle().lock().unwrap().clone()
}

#[test]
fn itl_grows_with_batch_size() {
    let mean_itl = |n: usize| {
        let mut core = core_with(config(), &[]);
        let now = Instant::now();
        let _rx: Vec<_> = (0..n)
            .map(|_| submit(&mut core, 8, Some(50), now))
            .collect();
        run_idle(&mut core, now);
        stats(&core).itl.mean()
    };
    let one = mean_itl(1);
    let sixteen = mean_itl(16);
    assert!((one - 0.010).abs() < 0.0005, "itl at batch 1: {one}");
    let expected = 0.010 * (1.0 + 0.03 * 15.0);
    assert!(
        (sixteen - expected).abs() < 0.001,
        "itl at batch 16: {sixteen} vs {expected}"
    );
}

#[test]
fn idle_engine_parks_and_ttft_is_base() {
    let mut core = core_with(config(), &[]);
    let now = Instant::now();
    assert_eq!(core.next_wake(now), None);
    let mut rx = submit(&mut core, 8, Some(3), now);
    run_idle(&mut core, now);
    let ev = drain(&mut rx);
    assert_eq!(
        ev[0],
        SeqEvent::Scheduled {
            queue_time: Duration::ZERO,
            cached_tokens: 0,
        }
    );
    assert_eq!(ev.len(), 1 + 3 + 1);
    assert!(matches!(
        ev[3],
        SeqEvent::Token {
            finish: Some(FinishReason::Length),
            ..
        }
    ));
    assert_eq!(
        ev[4],
        SeqEvent::Done {
            prompt_tokens: 8,
            completion_tokens: 3
        }
    );
    let st = stats(&core);
    assert!(
        (st.ttft.mean() - 0.010).abs() < 1e-6,
        "ttft {}",
        st.ttft.mean()
    );
    assert_eq!((st.running, st.waiting, st.kv_used_blocks), (0, 0, 0));
}

#[test]
fn queue_forms_beyond_max_num_seqs() {
    let mut core = core_with(
        EngineConfig {
            max_num_seqs: 4,
            ..config()
        },
        &[],
    );
    let now = Instant::now();
    let mut rxs: Vec<_> = (0..10)
        .map(|_| submit(&mut core, 8, Some(20), now))
        .collect();
    core.schedule(now);
    assert_eq!((core.running(), core.waiting()), (4, 6));
    assert_eq!(stats(&core).waiting, 6);
    run_idle(&mut core, now);
    let queue_times: Vec<Duration> = rxs
        .iter_mut()
        .map(|rx| match drain(rx).first() {
            Some(SeqEvent::Scheduled { queue_time, .. }) => *queue_time,
            other => panic!("first event {other:?}"),
        })
        .collect();
    assert!(queue_times[..4].iter().all(|q| q.is_zero()));
    assert!(
        queue_times[4..]
            .iter()
            .all(|q| *q > Duration::from_millis(100)),
        "{queue_times:?}"
    );
    assert_eq!(stats(&core).finished(FinishReason::Length), 10);
}

#[test]
fn kv_pressure_preempts_newest_and_resumes() {
    let cfg = EngineConfig {
        kv_blocks: 4,
        block_size: 4,
        ..config()
    };
    let mut core = core_with(cfg, &[]);
    let now = Instant::now();
    let mut a = submit(&mut core, 4, Some(12), now);
    let mut b = submit(&mut core, 4, Some(12), now);
    run_idle(&mut core, now);
    assert!(stats(&core).preemptions >= 1);
    for rx in [&mut a, &mut b] {
        let ev = drain(rx);
        let tokens = ev
            .iter()
            .filter(|e| matches!(e, SeqEvent::Token { .. }))
            .count();
        assert_eq!(tokens, 12);
        assert_eq!(
            ev.iter()
                .filter(|e| matches!(e, SeqEvent::Scheduled { .. }))
                .count(),
            1
        );
        assert_eq!(
            ev.last(),
            Some(&SeqEvent::Done {
                prompt_tokens: 4,
                completion_tokens: 12
            })
        );
    }
    assert_eq!(core.kv().used(), 0);
}

#[test]
fn kv_leak_raises_usage_and_triggers_preemption() {
    let run = |faults: &[&str]| {
        let cfg = EngineConfig {
            kv_blocks: 16,
            block_size: 4,
            ..config()
        };
        let mut core = core_with(cfg, faults);
        let now = Instant::now();
        let _a = submit(&mut core, 4, Some(4), now);
        let now = run_idle(&mut core, now);
        let usage_after_first = stats(&core).kv_usage();
        let _b = submit(&mut core, 4, Some(20), now);
        let _c = submit(&mut core, 4, Some(20), now);
        run_idle(&mut core, now);
        (usage_after_first, stats(&core))
    };
    let (usage, clean) = run(&[]);
    assert_eq!((usage, clean.preemptions), (0.0, 0));
    let (usage, leaky) = run(&["kv_leak:blocks=6"]);
    assert!(usage >= 6.0 / 16.0, "usage {usage}");
    assert!(leaky.preemptions > 0);
    assert!(leaky.kv_leaked_blocks >= 6);
}

#[test]
fn leak_reclaimed_when_fault_disabled() {
    let cfg = EngineConfig {
        kv_blocks: 16,
        block_size: 4,
        ..config()
    };
    let board = Arc::new(FaultBoard::default());
    board.enable(parse_fault("kv_leak:blocks=6").unwrap());
    let mut core = EngineCore::new(Arc::new(cfg), Arc::clone(&board));
    let now = Instant::now();
    let _a = submit(&mut core, 4, Some(4), now);
    let now = run_idle(&mut core, now);
    assert_eq!(core.kv().leaked(), 6);
    board.disable("kv_leak", None);
    core.sync_faults(now);
    assert_eq!(core.kv().leaked(), 0);
}

#[test]
fn error_burst_rejects_before_scheduling() {
    let mut core = core_with(config(), &["error_burst:rate=1,status=502"]);
    let mut rx = submit(&mut core, 4, None, Instant::now());
    assert!(matches!(
        drain(&mut rx).as_slice(),
        [SeqEvent::Rejected { status: 502, .. }]
    ));
    assert_eq!(core.waiting(), 0);
}

#[test]
fn latency_spike_multiplies_ttft_and_itl() {
    let mut core = core_with(config(), &["latency_spike:factor=3,share=1"]);
    let now = Instant::now();
    let _rx = submit(&mut core, 4, Some(20), now);
    run_idle(&mut core, now);
    let st = stats(&core);
    assert!(
        (st.ttft.mean() - 0.030).abs() < 1e-6,
        "ttft {}",
        st.ttft.mean()
    );
    assert!(
        (st.itl.mean() - 0.030).abs() < 1e-3,
        "itl {}",
        st.itl.mean()
    );
}

#[test]
fn stall_pauses_stream_then_continues() {
    let mut core = core_with(config(), &["stall:seconds=2,rate=1"]);
    let now = Instant::now();
    let mut rx = submit(&mut core, 4, Some(10), now);
    let end = run_idle(&mut core, now);
    assert!(end - now >= Duration::from_secs(2));
    let tokens = drain(&mut rx)
        .iter()
        .filter(|e| matches!(e, SeqEvent::Token { .. }))
        .count();
    assert_eq!(tokens, 10);
    let itl = stats(&core).itl;
    let below_one_s = itl.cumulative().find(|(b, _)| *b == 1.0).map(|(_, c)| c);
    assert_eq!(below_one_s, Some(itl.count() - 1));
}

#[test]
fn cancelled_clients_free_their_blocks() {
    let mut core = core_with(config(), &[]);
    let now = Instant::now();
    let rx = submit(&mut core, 100, Some(50), now);
    core.schedule(now);
    assert!(core.kv().used() > 0);
    drop(rx);
    core.purge_cancelled();
    assert_eq!((core.running(), core.kv().used()), (0, 0));
    assert_eq!(stats(&core).finished(FinishReason::Abort), 1);
}

#[test]
fn prompt_longer_than_context_is_rejected() {
    let mut core = core_with(
        EngineConfig {
            max_model_len: 100,
            ..config()
        },
        &[],
    );
    let mut rx = submit(&mut core, 150, None, Instant::now());
    assert!(matches!(
        drain(&mut rx).as_slice(),
        [SeqEvent::Rejected { status: 400, .. }]
    ));
}

#[test]
fn full_leak_degrades_but_never_deadlocks() {
    let cfg = EngineConfig {
        kv_blocks: 32,
        block_size: 4,
        ..config()
    };
    let mut core = core_with(cfg, &["kv_leak:blocks=1000"]);
    let now = Instant::now();
    let mut rxs: Vec<_> = (0..6)
        .map(|_| submit(&mut core, 8, Some(30), now))
        .collect();
    run_idle(&mut core, now);
    assert_eq!(core.waiting(), 0);
    for rx in &mut rxs {
        assert!(matches!(
            drain(rx).last(),
            Some(SeqEvent::Done {
                completion_tokens: 30,
                ..
            })
        ));
    }
    let st = stats(&core);
    assert!(st.preemptions > 0);
    assert!(st.kv_usage() > 0.9, "usage {}", st.kv_usage());
}

#[test]
fn reasoning_tokens_come_first_and_take_decode_steps() {
    let mut core = core_with(config(), &[]);
    let now = Instant::now();
    let (tx, mut rx) = unbounded_channel();
    let req = SubmitRequest {
        prompt_tokens: 8,
        prefix_hashes: vec![],
        max_tokens: Some(6),
        reasoning_tokens: 4,
        events: tx,
    };
    core.submit(req, now);
    run_idle(&mut core, now);
    let flags: Vec<bool> = drain(&mut rx)
        .iter()
        .filter_map(|e| match e {
            SeqEvent::Token { reasoning, .. } => Some(*reasoning),
            _ => None,
        })
        .collect();
    assert!(flags.len() > 4 && flags.len() <= 6, "{flags:?}");
    assert!(flags[..4].iter().all(|r| *r) && flags[4..].iter().all(|r| !r));
    // Every token is a decode step: the first answer token comes 4 steps after the first one.
    let st = stats(&core);
    assert_eq!(st.generation_tokens, flags.len() as u64);
    assert_eq!(st.itl.count(), flags.len() as u64 - 1);
}

#[path = "leak_tests.rs"]
mod leak;

/// With --speed-drift, an idle engine's TTFT at time t is the base TTFT times the drift factor
/// at t (virtual time: the engine is driven 10 minutes ahead of its epoch without waiting).
#[test]
fn speed_drift_scales_ttft_and_itl_over_time() {
    let cfg = EngineConfig {
        ttft_ms: 100.0,
        itl_ms: 20.0,
        prefill_ms_per_token: 0.5,
        speed_drift: 0.2,
        speed_drift_period_s: 600.0,
        seed: 7,
        ..config()
    };
    let drift = SpeedDrift::new(0.2, 600.0, 7);
    // The slowest and fastest moments of the first period, to the second.
    let grid: Vec<u64> = (0..600).collect();
    let factor = |t: u64| drift.factor(t as f64);
    let slowest = *grid
        .iter()
        .max_by(|a, b| factor(**a).total_cmp(&factor(**b)))
        .unwrap();
    let fastest = *grid
        .iter()
        .min_by(|a, b| factor(**a).total_cmp(&factor(**b)))
        .unwrap();
    assert!(factor(slowest) - factor(fastest) > 0.15);
    let measure = |t: u64| {
        let epoch = Instant::now();
        let board = Arc::new(FaultBoard::default());
        let mut core = EngineCore::new(Arc::new(cfg.clone()), board).with_epoch(epoch);
        let now = epoch + Duration::from_secs(t);
        let _rx = submit(&mut core, 40, Some(5), now);
        run_idle(&mut core, now);
        let st = stats(&core);
        (st.ttft.mean(), st.itl.mean(), core.speed())
    };
    for t in [slowest, fastest] {
        let (ttft, itl, speed) = measure(t);
        let f = factor(t);
        assert!((speed - f).abs() < 1e-3, "t={t}: speed {speed} vs {f}");
        // TTFT = (base + 40 prompt tokens × 0.5 ms) × factor; ITL = 20 ms × factor.
        let want = 0.120 * f;
        assert!((ttft - want).abs() < 1e-4, "t={t}: ttft {ttft} vs {want}");
        assert!(
            (itl - 0.020 * f).abs() < 1e-4,
            "t={t}: itl {itl} vs {}",
            0.020 * f
        );
    }
    // Without drift the same engine keeps its base speed at any time.
    let mut core = core_with(config(), &[]);
    let now = Instant::now() + Duration::from_secs(slowest);
    let _rx = submit(&mut core, 8, Some(3), now);
    run_idle(&mut core, now);
    assert_eq!(core.speed(), 1.0);
    assert!((stats(&core).ttft.mean() - 0.010).abs() < 1e-6);
}
