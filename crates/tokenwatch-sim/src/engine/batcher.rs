// Continuous-batching core of one engine, free of I/O and driven by the caller's clock:
// admission from a FIFO queue, KV allocation, preemption, one token per running sequence per step.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::EngineConfig;
use super::kv::KvCache;
use super::sampling::{apply_request_faults, output_length};
use super::seq::{SeqEvent, SeqState, Sequence, SubmitRequest};
use super::speed::SpeedDrift;
use crate::fault::FaultBoard;
use crate::metrics::{EngineStats, FinishReason};
use crate::vocab::token_text;

/// Engine state; the task in task.rs drives it with real (tokio) time.
pub struct EngineCore {
    cfg: Arc<EngineConfig>,
    board: Arc<FaultBoard>,
    stats: Arc<Mutex<EngineStats>>,
    kv: KvCache,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    rng: StdRng,
    /// Prefill work (ms) admitted for the coming step; it slows that step for everyone.
    step_prefill_ms: f64,
    /// GPU memory the `kv_leak` fault has leaked outside the KV pool (bytes, never freed
    /// until the fault goes away), and when the per-second part of it was last added.
    leaked_bytes: f64,
    leak_tick: Option<Instant>,
    /// Slow speed drift, measured from `epoch`; `speed` is its factor at the last
    /// scheduling pass (it multiplies base TTFT, prefill and the decode step).
    drift: SpeedDrift,
    epoch: Instant,
    speed: f64,
}

fn ms(v: f64) -> Duration {
    Duration::from_secs_f64((v / 1000.0).max(0.0))
}

impl EngineCore {
    /// A new engine; its speed drift is timed from now (see [`EngineCore::with_epoch`]).
    pub fn new(cfg: Arc<EngineConfig>, board: Arc<FaultBoard>) -> EngineCore {
        let stats = EngineStats::new(cfg.kv_blocks, cfg.max_model_len);
        EngineCore {
            drift: SpeedDrift::new(cfg.speed_drift, cfg.speed_drift_period_s, cfg.seed),
            epoch: Instant::now(),
            speed: 1.0,
            kv: KvCache::new(cfg.kv_blocks),
            rng: StdRng::seed_from_u64(cfg.seed),
            stats: Arc::new(Mutex::new(stats)),
            waiting: VecDeque::new(),
            running: Vec::new(),
            step_prefill_ms: 0.0,
            leaked_bytes: 0.0,
            leak_tick: None,
            cfg,
            board,
        }
    }

    /// Time the speed drift from `epoch` instead of from the engine's creation.
    pub fn with_epoch(mut self, epoch: Instant) -> EngineCore {
        self.epoch = epoch;
        self
    }

    /// The speed factor in use (1 without drift; above 1 is slower).
    pub fn speed(&self) -> f64 {
        self.speed
    }

    /// Recompute the drift factor for `now` (once per scheduling pass, not per token).
    fn update_speed(&mut self, now: Instant) {
        if self.drift.is_on() {
            let t = now.saturating_duration_since(self.epoch).as_secs_f64();
            self.speed = self.drift.factor(t);
        }
    }

    pub fn stats_handle(&self) -> Arc<Mutex<EngineStats>> {
        Arc::clone(&self.stats)
    }

    fn lock_stats(stats: &Mutex<EngineStats>) -> MutexGuard<'_, EngineStats> {
        stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// GPU memory leaked outside the KV pool so far (bytes).
    pub fn leaked_bytes(&self) -> u64 {
        self.leaked_bytes as u64
    }

    /// Most the leak can take: whatever the GPU has left beside the weights and the KV pool.
    fn leak_room(&self) -> f64 {
        let pool = u64::from(self.cfg.kv_blocks).saturating_mul(self.cfg.block_bytes);
        self.cfg
            .gpu_total_bytes
            .saturating_sub(self.cfg.weights_bytes.saturating_add(pool)) as f64
    }

    fn add_leak(&mut self, bytes: f64) {
        self.leaked_bytes = (self.leaked_bytes + bytes.max(0.0)).min(self.leak_room());
    }

    /// The time-driven part of `kv_leak`: `rate` bytes per second for as long as the engine has
    /// requests (running or waiting); an idle engine leaks nothing.
    fn accrue_leak(&mut self, now: Instant, rate: f64) {
        let busy = !self.running.is_empty() || !self.waiting.is_empty();
        if rate <= 0.0 || !busy {
            self.leak_tick = None;
            return;
        }
        if let Some(prev) = self.leak_tick {
            self.add_leak(rate * now.saturating_duration_since(prev).as_secs_f64());
        }
        self.leak_tick = Some(now);
    }

    /// Take a new request: reject it (error burst, too long) or queue it with its draws.
    pub fn submit(&mut self, req: SubmitRequest, now: Instant) {
        let fx = self.board.effects(&self.cfg.model, now);
        let reject = |req: &SubmitRequest, status: u16, kind: &'static str, message: String| {
            let _ = req.events.send(SeqEvent::Rejected {
                status,
                kind,
                message,
            });
        };
        if let Some((_, status)) = fx
            .error_burst
            .filter(|(rate, _)| self.rng.random_bool(*rate))
        {
            Self::lock_stats(&self.stats).count_finished(FinishReason::Error);
            let msg = "simulated engine failure (error_burst fault)".to_string();
            return reject(&req, status, "ServiceUnavailableError", msg);
        }
        let prompt = req.prompt_tokens.max(1);
        if prompt >= self.cfg.max_model_len || self.cfg.blocks_for(prompt + 1) > self.kv.total() {
            let msg = format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens in the prompt.",
                self.cfg
                    .max_model_len
                    .min(self.kv.total() * self.cfg.block_size),
                prompt
            );
            return reject(&req, 400, "BadRequestError", msg);
        }
        let room = self.cfg.max_model_len - prompt;
        let (target, reason) = output_length(
            &mut self.rng,
            req.max_tokens,
            self.cfg.default_max_tokens,
            room,
            req.reasoning_tokens,
            &fx,
        );
        let mut seq = Sequence::new(req, target, reason, now);
        seq.prompt_tokens = prompt;
        apply_request_faults(&mut self.rng, &mut seq, &fx);
        self.waiting.push_back(seq);
    }

    /// Drop sequences whose client went away, freeing their KV blocks.
    pub fn purge_cancelled(&mut self) {
        let before = self.waiting.len() + self.running.len();
        self.waiting.retain(|s| !s.cancelled());
        let kv = &mut self.kv;
        self.running.retain(|s| {
            if s.cancelled() {
                kv.release(s.blocks);
            }
            !s.cancelled()
        });
        let gone = before - self.waiting.len() - self.running.len();
        let mut st = Self::lock_stats(&self.stats);
        for _ in 0..gone {
            st.count_finished(FinishReason::Abort);
        }
    }

    /// Give leaked blocks and memory back once no kv_leak fault applies any more.
    pub fn sync_faults(&mut self, now: Instant) {
        let leaking = self.kv.leaked() > 0 || self.leaked_bytes > 0.0;
        if leaking && self.board.effects(&self.cfg.model, now).leak_blocks == 0 {
            self.kv.reclaim_leaked();
            self.leaked_bytes = 0.0;
            self.leak_tick = None;
            let mut st = Self::lock_stats(&self.stats);
            self.publish(&mut st);
        }
    }

    /// Admit waiting sequences in FIFO order while batch slots and KV blocks allow.
    pub fn schedule(&mut self, now: Instant) {
        let leak_rate = self.board.effects(&self.cfg.model, now).leak_bytes_per_s;
        self.accrue_leak(now, leak_rate);
        self.update_speed(now);
        let stats = Arc::clone(&self.stats);
        let mut st = Self::lock_stats(&stats);
        // Prefill work slows the next decode step only if there is one to slow.
        let decoding = self.has_active_decoders(now);
        while self.running.len() < self.cfg.max_num_seqs {
            let Some(head) = self.waiting.front() else {
                break;
            };
            // Room for the context plus the token the prefill produces.
            let need = self.cfg.blocks_for(head.context_len() + 1);
            if self.running.is_empty() {
                // A leak degrades the engine but never deadlocks it: with nothing running,
                // enough leaked blocks come back for the head of the queue to run alone.
                self.kv.unleak_until_free(need);
            }
            if !self.kv.try_alloc(need) {
                break; // head-of-line blocking, as in vLLM's FCFS scheduler
            }
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            seq.blocks = need;
            let mut compute = seq.context_len();
            if seq.first_scheduled.is_none() {
                seq.first_scheduled = Some(now);
                let cached = self.kv.match_prefix(&seq.prefix_hashes) * self.cfg.block_size;
                let cached = cached.min(seq.prompt_tokens.saturating_sub(1));
                compute -= cached;
                st.prompt_tokens += u64::from(seq.prompt_tokens);
                st.prefix_queries += u64::from(seq.prompt_tokens);
                st.prefix_hits += u64::from(cached);
                let queue_time = now.saturating_duration_since(seq.arrival);
                st.queue.observe(queue_time.as_secs_f64());
                seq.send(SeqEvent::Scheduled {
                    queue_time,
                    cached_tokens: cached,
                });
            }
            let prefill_ms = f64::from(compute) * self.cfg.prefill_ms_per_token;
            if decoding {
                self.step_prefill_ms += prefill_ms;
            }
            let ready_at = now + ms((self.cfg.ttft_ms + prefill_ms) * self.speed * seq.slow);
            seq.state = SeqState::Prefilling { ready_at };
            self.running.push(seq);
        }
        self.publish(&mut st);
    }

    fn publish(&self, st: &mut EngineStats) {
        st.running = self.running.len();
        st.waiting = self.waiting.len();
        st.kv_used_blocks = self.kv.used();
        st.kv_leaked_blocks = self.kv.leaked();
        st.leaked_bytes = self.leaked_bytes as u64;
    }

    /// Decode step time for the current batch: itl × (1 + α·(n−1)) plus admitted prefill work,
    /// times the drift factor.
    pub fn step_duration(&self) -> Duration {
        let n = self.running.len().max(1) as f64;
        let base = self.cfg.itl_ms * (1.0 + self.cfg.batch_slowdown * (n - 1.0));
        ms((base + self.step_prefill_ms) * self.speed)
    }

    /// Whether a decode step is due (some sequence decodes and is not stalled).
    pub fn has_active_decoders(&self, now: Instant) -> bool {
        self.running.iter().any(|s| s.active_decoder(now))
    }

    /// When the next step should end; None when nothing runs (park until a message).
    pub fn next_wake(&self, now: Instant) -> Option<Instant> {
        if self.running.is_empty() {
            return None;
        }
        if self.has_active_decoders(now) {
            return Some(now + self.step_duration());
        }
        // Only prefills in flight and stalled streams: sleep until the first of them is due.
        self.running
            .iter()
            .filter_map(|s| match s.state {
                SeqState::Prefilling { ready_at } => Some(ready_at),
                _ => s.stalled_until,
            })
            .min()
            .map(|t| t.max(now))
    }

    /// End of a step at `now`: every sequence that is due emits one token.
    pub fn advance(&mut self, now: Instant) {
        self.step_prefill_ms = 0.0;
        let leak_blocks = self.board.effects(&self.cfg.model, now).leak_blocks;
        let stats = Arc::clone(&self.stats);
        let mut st = Self::lock_stats(&stats);
        let mut i = 0;
        while i < self.running.len() {
            if !self.running[i].takes_step(now) {
                i += 1;
                continue;
            }
            if !self.grow_kv(i, &mut st) {
                continue; // preempted itself; index i now holds nothing or a later sequence
            }
            if self.emit_token(i, now, &mut st) {
                self.finish(i, now, leak_blocks, &mut st);
            } else {
                i += 1;
            }
        }
        self.publish(&mut st);
    }

    /// Make room for sequence `i`'s next token; preempts the newest sequences if needed.
    /// Returns false when sequence `i` itself had to be preempted.
    fn grow_kv(&mut self, i: usize, st: &mut EngineStats) -> bool {
        let need = self.cfg.blocks_for(self.running[i].context_len() + 1);
        if need <= self.running[i].blocks {
            return true;
        }
        while !self.kv.try_alloc(1) {
            let victim = self.running.len() - 1;
            self.preempt(victim, st);
            if victim == i {
                return false;
            }
        }
        self.running[i].blocks += 1;
        true
    }

    fn preempt(&mut self, idx: usize, st: &mut EngineStats) {
        let mut seq = self.running.remove(idx);
        self.kv.release(seq.blocks);
        seq.reset_for_requeue();
        st.preemptions += 1;
        self.waiting.push_front(seq);
    }

    /// Emit one token for sequence `i`; returns true when it reached its length.
    fn emit_token(&mut self, i: usize, now: Instant, st: &mut EngineStats) -> bool {
        let seq = &mut self.running[i];
        let reasoning = seq.generated < seq.reasoning;
        // The first token of the reasoning and of the answer carry no leading space.
        let first = seq.generated == 0 || seq.generated == seq.reasoning;
        let text = token_text(&mut self.rng, seq.drifted, first);
        match seq.last_token {
            None => st
                .ttft
                .observe(now.saturating_duration_since(seq.arrival).as_secs_f64()),
            Some(prev) => st
                .itl
                .observe(now.saturating_duration_since(prev).as_secs_f64()),
        }
        seq.first_token.get_or_insert(now);
        seq.last_token = Some(now);
        seq.state = SeqState::Decoding;
        seq.generated += 1;
        st.generation_tokens += 1;
        if seq.stall_at == Some(seq.generated) {
            seq.stalled_until = Some(now + seq.stall_for);
            seq.stall_at = None;
        }
        let done = seq.generated >= seq.target;
        let finish = done.then_some(seq.finish_reason);
        seq.send(SeqEvent::Token {
            text,
            reasoning,
            finish,
        });
        done
    }

    fn finish(&mut self, i: usize, now: Instant, leak_blocks: u32, st: &mut EngineStats) {
        let seq = self.running.remove(i);
        self.kv.release(seq.blocks);
        if leak_blocks > 0 {
            // The pool loses what it still has; the memory is kept outside it either way.
            self.kv.leak(leak_blocks);
            self.add_leak(f64::from(leak_blocks) * self.cfg.block_bytes as f64);
        }
        let secs = |from: Option<Instant>| {
            now.saturating_duration_since(from.unwrap_or(seq.arrival))
                .as_secs_f64()
        };
        st.count_finished(seq.finish_reason);
        st.e2e.observe(secs(Some(seq.arrival)));
        st.inference.observe(secs(seq.first_scheduled));
        st.prefill.observe(
            seq.first_token
                .unwrap_or(now)
                .saturating_duration_since(seq.first_scheduled.unwrap_or(seq.arrival))
                .as_secs_f64(),
        );
        st.decode.observe(secs(seq.first_token));
        st.prompt_len.observe(f64::from(seq.prompt_tokens));
        st.generation_len.observe(f64::from(seq.generated));
        seq.send(SeqEvent::Done {
            prompt_tokens: seq.prompt_tokens,
            completion_tokens: seq.generated,
        });
    }
}

#[cfg(test)]
#[path = "batcher_tests.rs"]
mod tests;
