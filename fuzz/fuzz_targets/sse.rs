// Fuzz target: the proxy's SSE observer for every stream format (chat, Responses, Anthropic) on
// arbitrary bytes cut at arbitrary points. Beyond "no panic": what it observes must not depend on
// where the stream was split, because TCP may split it anywhere.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenwatch::sources::proxy::sse::{SseObserver, StreamFormat};

const FORMATS: [StreamFormat; 3] = [StreamFormat::OpenAi, StreamFormat::Responses, StreamFormat::Anthropic];

fn observe(format: StreamFormat, pieces: &[&[u8]]) -> (u32, u32, String, Option<String>) {
    let mut o = SseObserver::new(format);
    let mut content = 0;
    for p in pieces {
        content += o.feed(p).content_events;
    }
    content += o.finish().content_events;
    assert_eq!(content, o.content_events, "per-feed counts add up to the total");
    assert!(o.content_events <= o.events, "content events are events");
    (o.events, o.content_events, format!("{:?}", o.seen), o.malformed.map(|m| m.chars().take(0).collect()))
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let format = FORMATS[usize::from(selector) % FORMATS.len()];
    // The next two bytes place two cuts; the rest is the stream.
    let (cuts, stream) = rest.split_at(rest.len().min(2));
    let whole = observe(format, &[stream]);
    let mut points: Vec<usize> = cuts.iter().map(|c| usize::from(*c) * stream.len() / 256).collect();
    points.sort_unstable();
    let (a, b) = (points.first().copied().unwrap_or(0), points.last().copied().unwrap_or(0));
    let split = observe(format, &[&stream[..a], &stream[a..b], &stream[b..]]);
    assert_eq!(whole, split, "the observation depends on where the stream was cut");
});
