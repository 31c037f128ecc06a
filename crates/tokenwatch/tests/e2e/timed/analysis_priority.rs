// The analysis threads' priority as the kernel sees it in the running binary (Linux): with
// `runtime.analysis_idle` they are under SCHED_IDLE and the proxy's threads are not; without it,
// nothing runs under SCHED_IDLE. The proxy's threads ask for a short scheduler slice
// (`runtime.proxy_slice_us`) where the kernel keeps one per thread.

#![cfg(target_os = "linux")]

use crate::common;

use common::*;

/// SCHED_IDLE in `/proc/<pid>/task/<tid>/stat`'s policy field (the 41st).
const SCHED_IDLE: u32 = 5;

/// (thread name, what `read` finds in its `/proc/<pid>/task/<tid>` directory) of every thread
/// of `pid` it finds something for.
fn per_thread<T>(pid: u32, read: impl Fn(&std::path::Path) -> Option<T>) -> Vec<(String, T)> {
    let tasks =
        std::fs::read_dir(format!("/proc/{pid}/task")).expect("reading the process's threads");
    tasks
        .filter_map(|t| {
            let dir = t.ok()?.path();
            let name = std::fs::read_to_string(dir.join("comm"))
                .ok()?
                .trim()
                .to_string();
            Some((name, read(&dir)?))
        })
        .collect()
}

/// (thread name, scheduling policy) of every thread of `pid`.
fn thread_policies(pid: u32) -> Vec<(String, u32)> {
    per_thread(pid, |dir| {
        let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
        // After the name, the fields start at 3 (state), so the policy (field 41) is the 39th.
        stat.rsplit_once(") ")?.1.split(' ').nth(38)?.parse().ok()
    })
}

fn is_analysis(name: &str) -> bool {
    ["tw-analysis", "tokenwatch-pipe", "tokenwatch-stor"]
        .iter()
        .any(|p| name.starts_with(p))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analysis_idle_puts_only_the_analysis_threads_under_sched_idle() {
    let idle = Stack::start_with_config(&[], "runtime:\n  analysis_idle: true\n").await;
    let threads = thread_policies(idle.tw.child.id());
    let analysis: Vec<_> = threads.iter().filter(|(n, _)| is_analysis(n)).collect();
    assert!(
        analysis.len() >= 3,
        "analysis threads not found: {threads:?}"
    );
    assert!(
        analysis.iter().all(|(_, p)| *p == SCHED_IDLE),
        "{threads:?}"
    );
    let proxy: Vec<_> = threads
        .iter()
        .filter(|(n, _)| n.starts_with("tw-proxy"))
        .collect();
    assert!(
        !proxy.is_empty() && proxy.iter().all(|(_, p)| *p != SCHED_IDLE),
        "{threads:?}"
    );
    // Requests still flow and records still reach the store with analysis under SCHED_IDLE.
    let body = serde_json::json!({
        "model": "sim-llama-8b", "stream": true, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
    });
    let answer = chat_answer(idle.proxy, &body, &[("x-request-id", "idle-1")]).await;
    assert!(!answer.is_empty());
    let stored = stored_record(idle.api, "idle-1", &idle.tw).await;
    assert_eq!(stored["status"], 200, "{stored}");

    let default = Stack::start(&[], &[]).await;
    let threads = thread_policies(default.tw.child.id());
    assert!(threads.iter().all(|(_, p)| *p != SCHED_IDLE), "{threads:?}");
}

/// (thread name, scheduler slice in ns from `/proc/<pid>/task/<tid>/sched`) of every thread.
fn thread_slices(pid: u32) -> Vec<(String, u64)> {
    per_thread(pid, |dir| {
        let sched = std::fs::read_to_string(dir.join("sched")).ok()?;
        sched
            .lines()
            .find(|l| l.starts_with("se.slice"))?
            .rsplit(' ')
            .next()?
            .trim()
            .parse()
            .ok()
    })
}

/// Whether this kernel keeps a slice per normal thread (Linux 6.12+), asked on a thread of the
/// test's own.
fn kernel_keeps_slices() -> bool {
    std::thread::spawn(|| {
        tokenwatch_sched::set_current_thread_slice(std::time::Duration::from_micros(300)).is_ok()
    })
    .join()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_threads_ask_for_a_short_scheduler_slice_and_nothing_else_does() {
    let default = Stack::start(&[], &[]).await;
    let pid = default.tw.child.id();
    if !kernel_keeps_slices() {
        // An older kernel: the binary says it keeps the kernel's slice, and serves anyway.
        let log = default.tw.log();
        assert!(
            log.contains("runtime.proxy_slice_us"),
            "no word of the slice in the log:\n{log}"
        );
        return;
    }
    let threads = thread_slices(pid);
    let proxy: Vec<_> = threads
        .iter()
        .filter(|(n, _)| n.starts_with("tw-proxy"))
        .collect();
    assert!(
        !proxy.is_empty() && proxy.iter().all(|(_, s)| *s == 100_000),
        "{threads:?}"
    );
    let analysis: Vec<_> = threads.iter().filter(|(n, _)| is_analysis(n)).collect();
    assert!(
        analysis.len() >= 3 && analysis.iter().all(|(_, s)| *s != 100_000),
        "{threads:?}"
    );
    // Requests flow through the proxy's threads as before.
    let body = serde_json::json!({
        "model": "sim-llama-8b", "stream": true, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
    });
    assert!(!chat_answer(default.proxy, &body, &[]).await.is_empty());

    // A slice of its own choosing, then the kernel's default (0).
    let chosen = Stack::start_with_config(&[], "runtime:\n  proxy_slice_us: 2500\n").await;
    let threads = thread_slices(chosen.tw.child.id());
    assert!(
        threads
            .iter()
            .filter(|(n, _)| n.starts_with("tw-proxy"))
            .all(|(_, s)| *s == 2_500_000),
        "{threads:?}"
    );
    let kernel = Stack::start_with_config(&[], "runtime:\n  proxy_slice_us: 0\n").await;
    let threads = thread_slices(kernel.tw.child.id());
    let analysis_slice = threads
        .iter()
        .find(|(n, _)| is_analysis(n))
        .map(|(_, s)| *s);
    assert!(
        threads
            .iter()
            .filter(|(n, _)| n.starts_with("tw-proxy"))
            .all(|(_, s)| Some(*s) == analysis_slice),
        "{threads:?}"
    );
}
