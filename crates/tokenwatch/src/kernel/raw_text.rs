// What the proxy keeps of one request for text capture: the request body and the response
// bytes as they passed, up to a limit. Here in the kernel because the telemetry queue carries it
// from the proxy to the pipeline; extraction and masking are the capture stage's (`capture`).

use crate::kernel::stream_format::StreamFormat;
use bytes::Bytes;

/// Most response bytes the proxy keeps of one response for capture; the rest still flows.
const MAX_RAW_RESPONSE: usize = 4 * 1024 * 1024;

/// What the proxy keeps of one request for capture: the request body and the response bytes
/// as they passed. Nothing is parsed or masked on the proxy's threads; the pipeline does that.
#[derive(Debug)]
pub struct RawText {
    pub format: StreamFormat,
    pub region: String,
    pub request: Bytes,
    response: Vec<Bytes>,
    response_len: usize,
    /// The response was longer than what is kept.
    response_cut: bool,
    /// The upstream answered `text/event-stream`.
    pub event_stream: bool,
}

impl RawText {
    pub fn new(format: StreamFormat, region: String, request: Bytes) -> RawText {
        RawText {
            format,
            region,
            request,
            response: Vec::new(),
            response_len: 0,
            response_cut: false,
            event_stream: false,
        }
    }

    /// Keep a response chunk (a reference-counted clone, no copy) while under the limit.
    pub fn push(&mut self, data: &Bytes) {
        if self.response_len + data.len() <= MAX_RAW_RESPONSE {
            self.response_len += data.len();
            self.response.push(data.clone());
        } else {
            self.response_cut = true;
        }
    }

    /// Whether the response was longer than what is kept.
    pub fn response_cut(&self) -> bool {
        self.response_cut
    }

    /// The response bytes kept, in one piece.
    pub fn response_bytes(&self) -> Vec<u8> {
        let mut all = Vec::with_capacity(self.response_len);
        for b in &self.response {
            all.extend_from_slice(b);
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_response_is_kept_up_to_its_limit() {
        let mut raw = RawText::new(StreamFormat::OpenAi, "default".into(), Bytes::new());
        let big = Bytes::from(vec![b'x'; MAX_RAW_RESPONSE - 1]);
        raw.push(&big);
        raw.push(&Bytes::from_static(b"yy"));
        assert!(raw.response_cut);
        assert_eq!(raw.response_bytes().len(), MAX_RAW_RESPONSE - 1);
    }
}
