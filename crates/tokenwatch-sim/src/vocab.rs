// Built-in vocabularies for generated token text: a normal one and a shifted
// one used by the `drift` fault, plus vLLM-like empty chunks.

use rand::Rng;

const NORMAL: &[&str] = &[
    "the", "a", "model", "request", "token", "answer", "system", "data", "service", "latency",
    "is", "are", "can", "will", "should", "because", "when", "with", "for", "and", "to", "of",
    "in", "on", "this", "that", "it", "we", "you", "value", "result", "example", "simple", "fast",
    "slow", "queue", "memory", "cache", "batch", "server", "user", "question", "good", "first",
    "next", "then", "also", "however", "so", "more", "less", "time", "step", "output", "input",
    "text", "list", "number", "case", "way", "use", "make", "see", "run", "check", ".", ",", "\n",
];

const DRIFTED: &[&str] = &[
    "quantum",
    "banana",
    "pirate",
    "galaxy",
    "sonnet",
    "volcano",
    "zebra",
    "wizard",
    "ocean",
    "moonlight",
    "dragon",
    "crystal",
    "thunder",
    "velvet",
    "jungle",
    "comet",
    "harbor",
    "lantern",
    "meadow",
    "nebula",
    "!",
    "?",
    "...",
];

/// Chance that a chunk carries empty text (as vLLM emits for partial UTF-8 / special tokens).
pub const EMPTY_CHUNK_SHARE: f64 = 0.05;

/// Text of one generated token. `first` tokens carry no leading space.
pub fn token_text<R: Rng + ?Sized>(rng: &mut R, drifted: bool, first: bool) -> String {
    if rng.random_bool(EMPTY_CHUNK_SHARE) {
        return String::new();
    }
    let words = if drifted { DRIFTED } else { NORMAL };
    let w = words[rng.random_range(0..words.len())];
    let punct = matches!(w, "." | "," | "\n" | "!" | "?" | "...");
    if first || punct {
        w.to_string()
    } else {
        format!(" {w}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn seeded_and_some_empty() {
        let mut a = StdRng::seed_from_u64(7);
        let mut b = StdRng::seed_from_u64(7);
        let ta: Vec<String> = (0..400).map(|_| token_text(&mut a, false, false)).collect();
        let tb: Vec<String> = (0..400).map(|_| token_text(&mut b, false, false)).collect();
        assert_eq!(ta, tb);
        let empty = ta.iter().filter(|t| t.is_empty()).count();
        assert!((5..=45).contains(&empty), "empty chunks: {empty}");
    }
}
