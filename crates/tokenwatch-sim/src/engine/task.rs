// The engine's tokio task: parks while idle, otherwise sleeps until the end of
// each step and advances the batcher, taking new requests as they arrive.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until, timeout};

use super::EngineMsg;
use super::batcher::EngineCore;

/// While requests wait but nothing can run (e.g. a KV leak filled the cache), look again
/// this often for cancelled clients and expired faults.
const STALLED_RECHECK: Duration = Duration::from_millis(500);

pub async fn run(mut core: EngineCore, mut rx: mpsc::UnboundedReceiver<EngineMsg>) {
    loop {
        let now = Instant::now();
        core.purge_cancelled();
        core.sync_faults(now);
        core.schedule(now);
        let Some(wake) = core.next_wake(now) else {
            // Nothing running: park until work arrives (never busy-loop).
            let msg = if core.waiting() == 0 {
                rx.recv().await
            } else {
                match timeout(STALLED_RECHECK, rx.recv()).await {
                    Ok(msg) => msg,
                    Err(_) => continue,
                }
            };
            match msg {
                Some(msg) => apply(&mut core, msg),
                None => return,
            }
            continue;
        };
        // A decode step runs to its end; arrivals wait for the next one. Without active
        // decoders the engine only waits for prefills or stalls, so an arrival is scheduled now.
        let in_step = core.has_active_decoders(now);
        let step_end = sleep_until(wake);
        tokio::pin!(step_end);
        let step_done = loop {
            tokio::select! {
                _ = &mut step_end => break true,
                msg = rx.recv() => match msg {
                    Some(msg) => {
                        apply(&mut core, msg);
                        if !in_step {
                            break false;
                        }
                    }
                    None => return,
                },
            }
        };
        if step_done {
            core.advance(Instant::now());
        }
    }
}

fn apply(core: &mut EngineCore, msg: EngineMsg) {
    match msg {
        EngineMsg::Submit(req) => core.submit(req, Instant::now()),
        EngineMsg::FaultsChanged => core.sync_faults(Instant::now()),
    }
}
