// A request's life inside an engine: what a handler submits, the events it
// gets back, and the per-sequence state the batcher tracks.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::metrics::FinishReason;

/// What an HTTP handler hands to an engine.
#[derive(Debug)]
pub struct SubmitRequest {
    /// Estimated prompt length in tokens (>= 1).
    pub prompt_tokens: u32,
    /// Hashes of the prompt's full blocks, cumulative (for the prefix cache).
    pub prefix_hashes: Vec<u64>,
    /// The request's own output cap (`max_tokens` / `max_completion_tokens`).
    pub max_tokens: Option<u32>,
    /// Reasoning ("thinking") tokens generated before the answer; they count towards
    /// `max_tokens` and take decode steps like any other token.
    pub reasoning_tokens: u32,
    pub events: mpsc::UnboundedSender<SeqEvent>,
}

/// Events sent back to the handler, in order: `Rejected`, or `Scheduled`
/// then `Token`s (reasoning ones first; the last one carries the finish reason) then `Done`.
#[derive(Debug, Clone, PartialEq)]
pub enum SeqEvent {
    Rejected {
        status: u16,
        kind: &'static str,
        message: String,
    },
    Scheduled {
        queue_time: Duration,
        /// Prompt tokens found in the prefix cache (not computed again).
        cached_tokens: u32,
    },
    Token {
        text: String,
        /// Part of the reasoning phase rather than the answer.
        reasoning: bool,
        finish: Option<FinishReason>,
    },
    Done {
        prompt_tokens: u32,
        completion_tokens: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SeqState {
    Waiting,
    Prefilling { ready_at: Instant },
    Decoding,
}

/// One sequence in the waiting queue or the running batch.
#[derive(Debug)]
pub struct Sequence {
    pub prompt_tokens: u32,
    pub prefix_hashes: Vec<u64>,
    /// Output length at which the sequence ends, and the reason it ends with.
    pub target: u32,
    pub finish_reason: FinishReason,
    /// The first `reasoning` generated tokens are reasoning, the rest the answer.
    pub reasoning: u32,
    pub generated: u32,
    pub blocks: u32,
    pub state: SeqState,
    /// Latency multiplier (latency_spike); ITL is stretched by skipping steps.
    pub slow: f64,
    credit: f64,
    /// Stall once `generated` reaches this, for `stall_for`.
    pub stall_at: Option<u32>,
    pub stall_for: Duration,
    pub stalled_until: Option<Instant>,
    pub drifted: bool,
    pub arrival: Instant,
    pub first_scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    pub events: mpsc::UnboundedSender<SeqEvent>,
}

impl Sequence {
    pub fn new(req: SubmitRequest, target: u32, finish_reason: FinishReason, now: Instant) -> Self {
        Sequence {
            prompt_tokens: req.prompt_tokens,
            prefix_hashes: req.prefix_hashes,
            target,
            finish_reason,
            reasoning: req.reasoning_tokens,
            generated: 0,
            blocks: 0,
            state: SeqState::Waiting,
            slow: 1.0,
            credit: 0.0,
            stall_at: None,
            stall_for: Duration::ZERO,
            stalled_until: None,
            drifted: false,
            arrival: now,
            first_scheduled: None,
            first_token: None,
            last_token: None,
            events: req.events,
        }
    }

    /// Tokens whose KV entries the sequence holds (prompt + generated).
    pub fn context_len(&self) -> u32 {
        self.prompt_tokens + self.generated
    }

    pub fn stalled(&self, now: Instant) -> bool {
        self.stalled_until.is_some_and(|t| t > now)
    }

    /// Decoding and not stalled: needs the next step.
    pub fn active_decoder(&self, now: Instant) -> bool {
        self.state == SeqState::Decoding && !self.stalled(now)
    }

    /// Whether this sequence emits a token in the step ending at `now`.
    pub fn takes_step(&mut self, now: Instant) -> bool {
        match self.state {
            SeqState::Waiting => false,
            SeqState::Prefilling { ready_at } => ready_at <= now,
            SeqState::Decoding if self.stalled(now) => false,
            SeqState::Decoding => {
                self.stalled_until = None;
                self.credit += 1.0 / self.slow;
                if self.credit >= 1.0 - 1e-9 {
                    self.credit -= 1.0;
                    true
                } else {
                    false
                }
            }
        }
    }

    /// Back to the queue after preemption: KV freed, prefill to recompute.
    pub fn reset_for_requeue(&mut self) {
        self.blocks = 0;
        self.state = SeqState::Waiting;
        self.credit = 0.0;
    }

    /// The client went away.
    pub fn cancelled(&self) -> bool {
        self.events.is_closed()
    }

    pub fn send(&self, ev: SeqEvent) {
        // A closed channel means the client left; the batcher purges it next step.
        let _ = self.events.send(ev);
    }
}
