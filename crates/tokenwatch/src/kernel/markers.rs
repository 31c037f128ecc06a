// What a version or deploy marker is (spec section 8): its kind, where it was seen, and the row
// that records it — shared by the sources that observe versions (the scraper) and the markers
// stage that detects and compares them.

use rand::Rng;
use tokenwatch_store::MarkerRow;

/// What changed at a marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MarkerKind {
    ModelVersion,
    PromptVersion,
    Deploy,
    Custom,
}

impl MarkerKind {
    pub const ALL: [MarkerKind; 4] = [
        MarkerKind::ModelVersion,
        MarkerKind::PromptVersion,
        MarkerKind::Deploy,
        MarkerKind::Custom,
    ];

    pub fn name(self) -> &'static str {
        match self {
            MarkerKind::ModelVersion => "model_version",
            MarkerKind::PromptVersion => "prompt_version",
            MarkerKind::Deploy => "deploy",
            MarkerKind::Custom => "custom",
        }
    }

    pub fn parse(s: &str) -> Option<MarkerKind> {
        MarkerKind::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// Where a marker came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerSource {
    /// The proxy's version headers.
    Proxy,
    /// OTLP resource or span attributes.
    Otlp,
    /// `POST /api/v1/markers`.
    Api,
    /// A scraped runtime's `model_version` (`scraped`).
    Scrape,
}

impl MarkerSource {
    pub fn name(self) -> &'static str {
        match self {
            MarkerSource::Proxy => "proxy",
            MarkerSource::Otlp => "otlp",
            MarkerSource::Api => "api",
            MarkerSource::Scrape => "scrape",
        }
    }
}

/// A fresh marker id: `mk-` and 16 random hex digits.
pub fn new_marker_id() -> String {
    format!("mk-{:016x}", rand::rng().random::<u64>())
}

/// A marker row with a fresh id.
pub fn marker(
    kind: MarkerKind,
    model: &str,
    from_version: &str,
    to_version: &str,
    source: MarkerSource,
    at_unix_ms: i64,
    note: &str,
) -> MarkerRow {
    MarkerRow {
        id: new_marker_id(),
        kind: kind.name().into(),
        model: model.into(),
        from_version: from_version.into(),
        to_version: to_version.into(),
        source: source.name().into(),
        at_unix_ms,
        note: note.into(),
    }
}
