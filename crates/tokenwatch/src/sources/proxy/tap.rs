// The response-body tap: forwards each upstream frame to the client untouched while timing
// first token and every content chunk; finalises the request record when the body ends.

use super::route::Slot;
use super::sse::{Observed, SseObserver, StreamFormat};
use crate::kernel::queue::TelemetryQueue;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokenwatch_core::model::{ErrorClass, FirstToken, RequestRecord};
use tokio::time::{Instant, Sleep};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Most chunk arrival times kept per request; later chunks still count in the summary.
pub const MAX_CHUNK_OFFSETS: usize = 16_384;
/// Most bytes of a non-streaming JSON body copied to read its `usage`.
const MAX_JSON_COPY: usize = 4 * 1024 * 1024;

/// A request whose record is still being filled in; submitted exactly once.
pub struct InFlight {
    pub record: RequestRecord,
    pub started: Instant,
    pub queue: TelemetryQueue,
    /// The request's and response's bytes, kept for text capture when it is on.
    pub raw: Option<Box<crate::kernel::raw_text::RawText>>,
}

impl InFlight {
    /// Close the record (end time, gaps) and hand it to the telemetry queue.
    pub fn submit(mut self, error: Option<ErrorClass>) {
        let r = &mut self.record;
        r.end_s = self.started.elapsed().as_secs_f64();
        if r.error_class.is_none() {
            r.error_class = error;
        }
        r.summarize_gaps();
        self.queue.submit_with_text(self.record, self.raw);
    }
}

enum Mode {
    /// Boxed: the observer is far larger than the other modes.
    Sse(Box<SseObserver>),
    Json(StreamFormat, Vec<u8>),
    Opaque,
}

pub struct TapBody {
    inner: Incoming,
    flight: Option<InFlight>,
    mode: Mode,
    expect_done: bool,
    idle: Duration,
    idle_timer: Pin<Box<Sleep>>,
    /// Keep the request counted until the body is dropped: in its upstream pool (when the pool
    /// has several members), and among everything the proxy has in flight.
    _slots: [Option<Slot>; 2],
}

impl TapBody {
    /// `format`: the API whose events and bodies are read (from the endpoint); `event_stream`:
    /// the upstream answered `text/event-stream`; `json`: `application/json`; `slots`: the
    /// request's place in its upstream pool and in the proxy's in-flight count, released when
    /// the body is dropped.
    pub fn new(
        inner: Incoming,
        mut flight: InFlight,
        format: StreamFormat,
        event_stream: bool,
        json: bool,
        idle: Duration,
        slots: [Option<Slot>; 2],
    ) -> TapBody {
        let mode = if event_stream {
            Mode::Sse(Box::new(SseObserver::new(format)))
        } else if json {
            Mode::Json(format, Vec::new())
        } else {
            Mode::Opaque
        };
        let expect_done = event_stream && flight.record.status < 400;
        if let Some(raw) = flight.raw.as_mut() {
            raw.event_stream = event_stream;
        }
        TapBody {
            inner,
            flight: Some(flight),
            mode,
            expect_done,
            idle,
            idle_timer: Box::pin(tokio::time::sleep(idle)),
            _slots: slots,
        }
    }

    fn observe(&mut self, data: &Bytes) {
        let Some(flight) = self.flight.as_mut() else {
            return;
        };
        if let Some(raw) = flight.raw.as_mut() {
            raw.push(data);
        }
        match &mut self.mode {
            Mode::Sse(sse) => {
                let fed = sse.feed(data);
                if fed.content_events > 0 {
                    let at = flight.started.elapsed();
                    let r = &mut flight.record;
                    if r.first_token_s.is_none() {
                        r.first_token_s = Some(at.as_secs_f64());
                        if r.labels.model_id != super::UNKNOWN_MODEL {
                            flight.queue.first_token(FirstToken {
                                request_id: r.request_id.clone(),
                                model_id: r.labels.model_id.clone(),
                                instance: r.labels.instance.clone(),
                                arrival_unix_ms: r.arrival_unix_ms,
                                first_token_s: at.as_secs_f64(),
                            });
                        }
                    }
                    let us = u32::try_from(at.as_micros()).unwrap_or(u32::MAX);
                    for _ in 0..fed.content_events {
                        if r.chunk_offsets_us.len() < MAX_CHUNK_OFFSETS {
                            r.chunk_offsets_us.push(us);
                        }
                    }
                }
            }
            Mode::Json(_, buf) => {
                if buf.len() + data.len() <= MAX_JSON_COPY {
                    buf.extend_from_slice(data);
                }
            }
            Mode::Opaque => {}
        }
    }

    fn finish(&mut self, error: Option<ErrorClass>) {
        let Some(mut flight) = self.flight.take() else {
            return;
        };
        let mut error = error;
        let r = &mut flight.record;
        match &mut self.mode {
            Mode::Sse(sse) => {
                sse.finish();
                let seen = &mut sse.seen;
                // A client that closes once the terminal event reached it (before the upstream's
                // end of body reached the proxy) had the whole answer: not a cancellation.
                if error == Some(ErrorClass::ClientCancelled) && seen.done {
                    error = None;
                }
                if seen.completion_tokens.is_none() {
                    // No usage: every content event is counted as one token.
                    seen.completion_tokens = Some(u64::from(sse.content_events));
                    take_observed(r, seen, false);
                } else {
                    take_observed(r, seen, true);
                }
                if error.is_none() {
                    if seen.error_event {
                        error = Some(ErrorClass::Upstream5xx);
                    } else if let Some(why) = &sse.malformed {
                        tracing::debug!(request_id = %r.request_id, %why, "malformed event stream");
                        error = Some(ErrorClass::MalformedSse);
                    } else if self.expect_done && !seen.done {
                        let terminal = sse.format().terminal_event();
                        tracing::debug!(request_id = %r.request_id, "event stream ended without {terminal}");
                        error = Some(ErrorClass::MalformedSse);
                    }
                }
            }
            Mode::Json(format, buf) => {
                if let Some(mut seen) = format.json_body(buf) {
                    let from_usage = seen.completion_tokens.is_some();
                    take_observed(r, &mut seen, from_usage);
                }
            }
            Mode::Opaque => {}
        }
        flight.submit(error);
    }
}

/// Moves what the response said into its record; the model only when the request named none.
fn take_observed(r: &mut RequestRecord, seen: &mut Observed, from_usage: bool) {
    r.prompt_tokens = seen.prompt_tokens;
    r.output_tokens = seen.completion_tokens;
    r.reasoning_tokens = seen.reasoning_tokens;
    r.cached_input_tokens = seen.cached_input_tokens;
    r.tokens_from_usage = from_usage;
    r.finish_reason = seen.finish_reason.take().unwrap_or_default();
    if let Some(m) = seen.model.take() {
        if r.labels.model_id == super::UNKNOWN_MODEL {
            r.labels.model_id = m.clone();
        }
        r.span.response_model = m;
    }
}

impl Body for TapBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.observe(data);
                }
                let deadline = Instant::now() + this.idle;
                this.idle_timer.as_mut().reset(deadline);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                let class = if e.is_timeout() {
                    ErrorClass::UpstreamTimeout
                } else {
                    ErrorClass::UpstreamReset
                };
                this.finish(Some(class));
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Ready(None) => {
                this.finish(None);
                Poll::Ready(None)
            }
            Poll::Pending => {
                if this.flight.is_some() && this.idle_timer.as_mut().poll(cx).is_ready() {
                    this.finish(Some(ErrorClass::UpstreamTimeout));
                    return Poll::Ready(Some(Err(format!(
                        "upstream sent nothing for {:?} (proxy.idle_timeout)",
                        this.idle
                    )
                    .into())));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for TapBody {
    fn drop(&mut self) {
        if self.flight.is_some() {
            // An empty body may be dropped without being polled; anything else ending here
            // means the client went away first.
            let class = if self.inner.is_end_stream() {
                None
            } else {
                Some(ErrorClass::ClientCancelled)
            };
            self.finish(class);
        }
    }
}
