// Tests of the kv_leak fault as a GPU sees it, in virtual time: memory climbing steadily while
// KV blocks run out and the starved engine idles, and flat memory for a healthy swinging load.

use super::*;

/// Drive the engine in virtual time with one arrival at each of `arrivals` (seconds from the
/// start, sorted; 32-token prompts, 60-token outputs) and read its GPU every `every_s` seconds
/// until `until_s`.
fn gpu_samples(
    core: &mut EngineCore,
    arrivals: &[f64],
    every_s: f64,
    until_s: f64,
) -> Vec<crate::gpu::GpuReading> {
    let start = Instant::now();
    let at = |s: f64| start + Duration::from_secs_f64(s);
    let (mut now, mut next_arrival, mut next_sample) = (start, 0, every_s);
    let mut out = Vec::new();
    let mut rxs = Vec::new();
    while next_sample <= until_s {
        while next_arrival < arrivals.len() && at(arrivals[next_arrival]) <= now {
            rxs.push(submit(core, 32, Some(60), now));
            next_arrival += 1;
        }
        core.schedule(now);
        let mut wake = at(next_sample);
        if let Some(&a) = arrivals.get(next_arrival) {
            wake = wake.min(at(a));
        }
        let step_end = core.next_wake(now);
        if let Some(w) = step_end {
            wake = wake.min(w);
        }
        // A starved engine with nothing runnable re-checks like the task does.
        wake = wake.min(now + Duration::from_millis(500)).max(now);
        now = wake;
        if step_end.is_some_and(|w| w <= now) {
            core.advance(now);
        }
        if now >= at(next_sample) {
            core.schedule(now);
            out.push(crate::gpu::reading(&core.cfg, &stats(core)));
            next_sample += every_s;
        }
        rxs.retain_mut(|rx| !matches!(drain(rx).last(), Some(SeqEvent::Done { .. })));
    }
    out
}

fn steady(rate_per_s: f64, until_s: f64) -> Vec<f64> {
    let n = (rate_per_s * until_s) as usize;
    (0..n).map(|i| i as f64 / rate_per_s).collect()
}

const MIB_U64: u64 = 1 << 20;

#[test]
fn kv_leak_climbs_steadily_while_kv_blocks_run_out() {
    // 3 requests/s with the default leak, read every 5 s (tokenwatch's default scrape).
    let mut core = core_with(config(), &["kv_leak"]);
    let samples = gpu_samples(&mut core, &steady(3.0, 120.0), 5.0, 120.0);
    let used: Vec<u64> = samples.iter().map(|r| r.memory_used_bytes).collect();
    let base = (16u64 << 30) + 4096 * (2 << 20);
    assert!(used[0] > base, "leaking from the first sample: {used:?}");
    for w in used.windows(2) {
        // Never flat, never down: every 5 s sample is about 64 MiB/s × 5 s higher, or more.
        assert!(w[1] >= w[0] + 5 * 63 * MIB_U64, "{used:?}");
    }
    let st = stats(&core);
    assert_eq!(
        st.kv_leaked_blocks + st.kv_used_blocks,
        4096,
        "pool used up"
    );
    assert!(
        st.waiting > 50,
        "requests queue behind the leak: {}",
        st.waiting
    );
    // Starved of blocks, the engine runs one sequence at a time: utilisation under 5 %.
    let late: Vec<u32> = samples[samples.len() - 6..]
        .iter()
        .map(|r| r.util_pct)
        .collect();
    assert!(late.iter().all(|u| *u < 5), "{late:?}");
    let r = samples.last().unwrap();
    assert_eq!(r.processes.len(), 1);
    assert_eq!(r.processes[0].used_memory_bytes, r.memory_used_bytes);
    assert_eq!(r.processes[0].device_uuid, r.uuid);
}

#[test]
fn kv_leak_per_second_part_needs_work_and_stops_at_the_gpu_size() {
    let cfg = EngineConfig {
        gpu_total_bytes: (16u64 << 30) + 4096 * (2 << 20) + (1 << 30),
        ..config()
    };
    let mut core = core_with(cfg, &["kv_leak:blocks=1,mib_per_s=100"]);
    // Idle: no request, no leak.
    let idle = gpu_samples(&mut core, &[], 5.0, 30.0);
    assert!(
        idle.iter()
            .all(|r| r.memory_used_bytes == idle[0].memory_used_bytes)
    );
    assert_eq!(core.leaked_bytes(), 0);
    // 40 s of work leak 4 GB at 100 MiB/s, but only the 1 GiB left on this GPU is taken.
    let busy = gpu_samples(&mut core, &steady(2.0, 40.0), 5.0, 40.0);
    assert_eq!(core.leaked_bytes(), 1 << 30);
    let last = busy.last().unwrap();
    assert_eq!(last.memory_used_bytes, last.memory_total_bytes);
    assert_eq!(last.fb_free_mib(), 0);
}

#[test]
fn healthy_memory_stays_flat_under_swinging_load() {
    // Bursts of 40 req/s alternating with near-idle 0.5 req/s every 10 s: batch occupancy swings
    // from 0 to most of the batch, the pool is preallocated, so the framebuffer does not move.
    let mut arrivals = Vec::new();
    let mut t = 0.0;
    while t < 120.0 {
        let rate = if (t as u64 / 10).is_multiple_of(2) {
            40.0
        } else {
            0.5
        };
        arrivals.push(t);
        t += 1.0 / rate;
    }
    let mut core = core_with(config(), &[]);
    let samples = gpu_samples(&mut core, &arrivals, 1.0, 120.0);
    let utils: Vec<u32> = samples.iter().map(|r| r.util_pct).collect();
    assert!(
        utils.contains(&0) && utils.iter().any(|u| *u >= 50),
        "{utils:?}"
    );
    let first = samples[0].memory_used_bytes;
    assert!(samples.iter().all(|r| r.memory_used_bytes == first));
    assert_eq!(core.leaked_bytes(), 0);
}

#[test]
fn leaked_memory_is_given_back_with_the_blocks() {
    let board = Arc::new(FaultBoard::default());
    board.enable(parse_fault("kv_leak:blocks=6,mib_per_s=10").unwrap());
    let mut core = EngineCore::new(Arc::new(config()), Arc::clone(&board));
    gpu_samples(&mut core, &steady(2.0, 10.0), 5.0, 10.0);
    assert!(
        core.leaked_bytes() > 12 * (2 << 20),
        "{}",
        core.leaked_bytes()
    );
    board.disable("kv_leak", None);
    core.sync_faults(Instant::now());
    assert_eq!((core.leaked_bytes(), core.kv().leaked()), (0, 0));
    assert_eq!(stats(&core).leaked_bytes, 0);
}
