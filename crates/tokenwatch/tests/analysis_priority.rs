// The analysis threads' priority as the kernel sees it in the running binary (Linux): with
// `runtime.analysis_idle` they are under SCHED_IDLE and the proxy's threads are not; without it,
// nothing runs under SCHED_IDLE.

#![cfg(target_os = "linux")]

mod common;

use common::*;

/// SCHED_IDLE in `/proc/<pid>/task/<tid>/stat`'s policy field (the 41st).
const SCHED_IDLE: u32 = 5;

/// (thread name, scheduling policy) of every thread of `pid`.
fn thread_policies(pid: u32) -> Vec<(String, u32)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("reading the process's threads");
    tasks
        .filter_map(|t| {
            let stat = std::fs::read_to_string(t.ok()?.path().join("stat")).ok()?;
            let (name, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
            // `rest` starts at field 3 (state), so the policy (field 41) is its 39th.
            let policy = rest.split(' ').nth(38)?.parse().ok()?;
            Some((name.to_string(), policy))
        })
        .collect()
}

fn is_analysis(name: &str) -> bool {
    ["tw-analysis", "tokenwatch-pipe", "tokenwatch-stor"].iter().any(|p| name.starts_with(p))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analysis_idle_puts_only_the_analysis_threads_under_sched_idle() {
    let idle = Stack::start_with_config(&[], "runtime:\n  analysis_idle: true\n").await;
    let threads = thread_policies(idle.tw.child.id());
    let analysis: Vec<_> = threads.iter().filter(|(n, _)| is_analysis(n)).collect();
    assert!(analysis.len() >= 3, "analysis threads not found: {threads:?}");
    assert!(analysis.iter().all(|(_, p)| *p == SCHED_IDLE), "{threads:?}");
    let proxy: Vec<_> = threads.iter().filter(|(n, _)| n.starts_with("tw-proxy")).collect();
    assert!(!proxy.is_empty() && proxy.iter().all(|(_, p)| *p != SCHED_IDLE), "{threads:?}");
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
