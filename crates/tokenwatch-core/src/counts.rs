// Scraped counts: what one scrape of one serving instance added since the scrape before —
// finished and failed requests, and the bucket deltas of its latency histograms — kept in a
// short, sequence-numbered log that detectors read incrementally (sequential tests per replica).

use crate::histogram::CumulativeHistogram;
use std::collections::VecDeque;

/// What one scrape of one (model, instance) added since the previous scrape of the same target.
/// A missed scrape makes `interval_ms` longer and the counts cover the whole gap; a counter reset
/// (restart) counts the new reading as the increase (`histogram::counter_delta`).
#[derive(Debug, Clone, PartialEq)]
pub struct ScrapeCounts {
    pub model_id: String,
    pub instance: String,
    pub runtime: String,
    pub at_unix_ms: i64,
    /// Time since the previous scrape of the target.
    pub interval_ms: i64,
    /// Requests finished in the interval, failed ones included; None: the runtime reports none.
    pub finished: Option<f64>,
    /// Requests failed by the server in the interval (vLLM `finished_reason="error"`, TGI
    /// `tgi_request_failure`); None: not reported.
    pub failed: Option<f64>,
    /// Prompt and output tokens processed in the interval (vLLM `prompt_tokens_total`,
    /// `generation_tokens_total`, …); None: not reported.
    pub prompt_tokens: Option<f64>,
    pub output_tokens: Option<f64>,
    /// Latency histograms (`ttft`, `itl`, `e2e`, `queue`, …) → observations of the interval.
    pub latency: Vec<(String, CumulativeHistogram)>,
}

impl ScrapeCounts {
    /// Requests of the interval: finished ones, else the TTFT observations (one per request).
    pub fn requests(&self) -> Option<f64> {
        self.finished
            .or_else(|| self.histogram("ttft").map(|h| h.count))
    }

    /// Whether the scrape counted anything (a target of gauges only does not).
    pub fn is_empty(&self) -> bool {
        self.finished.is_none()
            && self.failed.is_none()
            && self.prompt_tokens.is_none()
            && self.output_tokens.is_none()
            && self.latency.is_empty()
    }

    /// The interval's histogram of `signal`, if the runtime reports it.
    pub fn histogram(&self, signal: &str) -> Option<&CumulativeHistogram> {
        self.latency
            .iter()
            .find(|(s, _)| s == signal)
            .map(|(_, h)| h)
    }
}

/// The newest scraped counts, each with a sequence number; the oldest go past `max_entries`.
/// Readers remember the last sequence they read (`since`) and learn what they missed (`skipped`).
#[derive(Debug)]
pub struct CountsLog {
    entries: VecDeque<(u64, ScrapeCounts)>,
    next_seq: u64,
    max_entries: usize,
}

impl Default for CountsLog {
    fn default() -> Self {
        CountsLog::new(8192)
    }
}

impl CountsLog {
    pub fn new(max_entries: usize) -> CountsLog {
        CountsLog {
            entries: VecDeque::new(),
            next_seq: 1,
            max_entries: max_entries.max(1),
        }
    }

    pub fn push(&mut self, c: ScrapeCounts) {
        if self.entries.len() == self.max_entries {
            self.entries.pop_front();
        }
        self.entries.push_back((self.next_seq, c));
        self.next_seq += 1;
    }

    /// Entries after sequence `after` (0: all kept), oldest first.
    pub fn since(&self, after: u64) -> impl Iterator<Item = &(u64, ScrapeCounts)> {
        let start = self.entries.partition_point(|(s, _)| *s <= after);
        self.entries.range(start..)
    }

    /// How many entries after `after` were dropped before they could be read.
    pub fn skipped(&self, after: u64) -> u64 {
        let oldest = self.entries.front().map_or(self.next_seq, |(s, _)| *s);
        oldest.saturating_sub(after + 1)
    }

    /// The sequence number of the newest entry (0: none yet).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(at: i64) -> ScrapeCounts {
        ScrapeCounts {
            model_id: "m".into(),
            instance: "i".into(),
            runtime: "vllm".into(),
            at_unix_ms: at,
            interval_ms: 1000,
            finished: Some(10.0),
            failed: Some(1.0),
            prompt_tokens: None,
            output_tokens: None,
            latency: vec![(
                "ttft".into(),
                CumulativeHistogram {
                    bounds: vec![0.1, f64::INFINITY],
                    cumulative: vec![9.0, 10.0],
                    sum: 1.0,
                    count: 10.0,
                },
            )],
        }
    }

    #[test]
    fn readers_get_what_came_after_their_sequence_and_learn_what_they_missed() {
        let mut log = CountsLog::new(3);
        assert_eq!(log.last_seq(), 0);
        assert_eq!(log.since(0).count(), 0);
        for t in 0..5 {
            log.push(counts(t));
        }
        assert_eq!(log.len(), 3);
        assert_eq!(log.last_seq(), 5);
        let seqs: Vec<u64> = log.since(0).map(|(s, _)| *s).collect();
        assert_eq!(seqs, vec![3, 4, 5]);
        assert_eq!(log.skipped(0), 2, "1 and 2 were dropped");
        assert_eq!(log.skipped(3), 0);
        let seqs: Vec<u64> = log.since(4).map(|(s, _)| *s).collect();
        assert_eq!(seqs, vec![5]);
        assert_eq!(log.since(5).count(), 0);
        assert_eq!(log.skipped(5), 0);
        assert!(log.since(3).next().unwrap().1.histogram("ttft").is_some());
        assert!(log.since(3).next().unwrap().1.histogram("itl").is_none());
    }
}
