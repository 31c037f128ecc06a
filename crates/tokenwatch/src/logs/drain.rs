// The Drain parse tree (He et al., ICWS 2017): lines are routed by token count, then by their
// first tokens, to a leaf of templates; a line joins the most similar one or starts its own.

use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};

/// The wildcard a template holds where its lines disagree.
pub const WILDCARD: &str = "<*>";

#[derive(Debug, Clone, PartialEq)]
pub struct DrainParams {
    /// Leading tokens that route a line below the token-count level.
    pub prefix_tokens: usize,
    /// Share of positions equal to a template's for a line to join it (0..1].
    pub similarity: f64,
    /// Children per tree node; further distinct tokens share a `<*>` child.
    pub max_children: usize,
    /// Templates kept at most; lines that would start another are refused.
    pub max_templates: usize,
}

impl Default for DrainParams {
    fn default() -> Self {
        DrainParams {
            prefix_tokens: 2,
            similarity: 0.5,
            max_children: 100,
            max_templates: 5_000,
        }
    }
}

/// One template: its tokens (constants, typed fields, `<*>`) and where it sits in the tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    /// Hash of the template text when the template was made: kept while it generalises, and
    /// persisted, so it is stable across restarts.
    pub id: String,
    pub tokens: Vec<String>,
    /// Keys from the token-count level down to the leaf.
    pub path: Vec<String>,
}

impl Cluster {
    pub fn text(&self) -> String {
        self.tokens.join(" ")
    }
}

#[derive(Debug, Default)]
struct Node {
    children: HashMap<String, Node>,
    clusters: Vec<usize>,
}

/// What `Drain::add` did with a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// Joined template `0` (`true`: the template generalised to take it).
    Joined(usize, bool),
    /// Started template `0`.
    New(usize),
    /// No template fits and `max_templates` are kept already.
    Refused,
}

#[derive(Debug, Default)]
pub struct Drain {
    params: DrainParams,
    root: Node,
    clusters: Vec<Cluster>,
    ids: HashSet<String>,
}

/// The stable id of a template text: 16 hex digits of its SHA-256.
pub fn template_id(text: &str) -> String {
    hex::encode(&Sha256::digest(text.as_bytes())[..8])
}

fn has_digit(s: &str) -> bool {
    s.bytes().any(|b| b.is_ascii_digit())
}

impl Drain {
    pub fn new(params: DrainParams) -> Drain {
        Drain {
            params,
            ..Drain::default()
        }
    }

    pub fn clusters(&self) -> &[Cluster] {
        &self.clusters
    }

    pub fn cluster(&self, i: usize) -> &Cluster {
        &self.clusters[i]
    }

    /// Route `tokens` to a template: the most similar one of its leaf when at least
    /// `similarity` of the positions agree (ties: the one with more wildcards), else a new one.
    pub fn add(&mut self, tokens: &[String]) -> Added {
        if let Some(i) = self.best_match(tokens) {
            let c = &mut self.clusters[i];
            let mut changed = false;
            for (t, l) in c.tokens.iter_mut().zip(tokens) {
                if t != l && t != WILDCARD {
                    *t = WILDCARD.to_string();
                    changed = true;
                }
            }
            return Added::Joined(i, changed);
        }
        if self.clusters.len() >= self.params.max_templates {
            return Added::Refused;
        }
        let text = tokens.join(" ");
        let mut id = template_id(&text);
        let mut n = 1;
        while self.ids.contains(&id) {
            n += 1;
            id = template_id(&format!("{text}\u{0}{n}"));
        }
        let path = self.insert_path(tokens);
        let i = self.restore(Cluster {
            id,
            tokens: tokens.to_vec(),
            path,
        });
        Added::New(i)
    }

    /// Put a template back at its recorded place (loading saved state). Returns its index.
    pub fn restore(&mut self, cluster: Cluster) -> usize {
        let i = self.clusters.len();
        let mut node = &mut self.root;
        for key in &cluster.path {
            node = node.children.entry(key.clone()).or_default();
        }
        node.clusters.push(i);
        self.ids.insert(cluster.id.clone());
        self.clusters.push(cluster);
        i
    }

    fn route_key(token: &str) -> &str {
        if has_digit(token) { WILDCARD } else { token }
    }

    fn best_match(&self, tokens: &[String]) -> Option<usize> {
        let mut node = self.root.children.get(&tokens.len().to_string())?;
        for t in tokens.iter().take(self.params.prefix_tokens) {
            node = node
                .children
                .get(Self::route_key(t))
                .or_else(|| node.children.get(WILDCARD))?;
        }
        let mut best: Option<(f64, usize, usize)> = None;
        for &i in &node.clusters {
            let c = &self.clusters[i];
            if c.tokens.len() != tokens.len() {
                continue;
            }
            let (mut same, mut wild) = (0usize, 0usize);
            for (t, l) in c.tokens.iter().zip(tokens) {
                if t == WILDCARD {
                    wild += 1;
                } else if t == l {
                    same += 1;
                }
            }
            let sim = if tokens.is_empty() {
                1.0
            } else {
                same as f64 / tokens.len() as f64
            };
            let better = match best {
                None => true,
                Some((s, w, _)) => sim > s || (sim == s && wild > w),
            };
            if better {
                best = Some((sim, wild, i));
            }
        }
        best.filter(|(s, _, _)| *s >= self.params.similarity)
            .map(|(_, _, i)| i)
    }

    /// The keys of a new template's leaf, creating nodes on the way: its own token while the
    /// node has room, else the node's `<*>` child.
    fn insert_path(&mut self, tokens: &[String]) -> Vec<String> {
        let max_children = self.params.max_children.max(2);
        let mut path = vec![tokens.len().to_string()];
        let mut node = self
            .root
            .children
            .entry(tokens.len().to_string())
            .or_default();
        for t in tokens.iter().take(self.params.prefix_tokens) {
            let key = Self::route_key(t);
            let key = if node.children.contains_key(key) || node.children.len() + 1 < max_children {
                key.to_string()
            } else {
                WILDCARD.to_string()
            };
            node = node.children.entry(key.clone()).or_default();
            path.push(key);
        }
        path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logs::mask::mask;
    use proptest::prelude::*;

    fn toks(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn similar_lines_merge_into_one_template_with_wildcards() {
        let mut d = Drain::new(DrainParams::default());
        let a = d.add(&toks(
            "Sequence group seq-a is preempted by PreemptionMode.RECOMPUTE mode",
        ));
        let Added::New(i) = a else { panic!("{a:?}") };
        let id = d.cluster(i).id.clone();
        assert_eq!(
            id,
            template_id("Sequence group seq-a is preempted by PreemptionMode.RECOMPUTE mode")
        );
        let b = d.add(&toks(
            "Sequence group seq-b is preempted by PreemptionMode.SWAP mode",
        ));
        assert_eq!(b, Added::Joined(i, true));
        assert_eq!(
            d.cluster(i).text(),
            "Sequence group <*> is preempted by <*> mode"
        );
        assert_eq!(
            d.cluster(i).id,
            id,
            "the id stays while the template generalises"
        );
        assert_eq!(
            d.add(&toks(
                "Sequence group seq-c is preempted by PreemptionMode.SWAP mode"
            )),
            Added::Joined(i, false)
        );
        // Same length, different first tokens: another leaf, another template.
        assert!(matches!(
            d.add(&toks(
                "Engine loop has died because of an unexpected error here"
            )),
            Added::New(_)
        ));
        // Too different within a leaf.
        assert!(matches!(
            d.add(&toks("Sequence group x was finished after all its tokens")),
            Added::New(_)
        ));
        assert_eq!(d.clusters().len(), 3);
    }

    #[test]
    fn full_nodes_share_a_wildcard_child_and_the_cap_refuses() {
        let mut d = Drain::new(DrainParams {
            max_children: 3,
            max_templates: 6,
            ..DrainParams::default()
        });
        for w in ["alpha", "beta", "gamma", "delta", "epsilon"] {
            assert!(
                matches!(d.add(&toks(&format!("{w} one {w}x {w}y"))), Added::New(_)),
                "{w}"
            );
        }
        let paths: Vec<&str> = d.clusters().iter().map(|c| c.path[1].as_str()).collect();
        assert_eq!(paths, ["alpha", "beta", WILDCARD, WILDCARD, WILDCARD]);
        // Lines routed through the wildcard child still find their template.
        assert!(matches!(
            d.add(&toks("epsilon one epsilonx epsilony")),
            Added::Joined(4, false)
        ));
        assert!(matches!(
            d.add(&toks("zeta nine eight seven")),
            Added::New(5)
        ));
        assert_eq!(d.add(&toks("eta four five six")), Added::Refused);
    }

    #[test]
    fn restoring_paths_rebuilds_the_same_routing() {
        let mut d = Drain::new(DrainParams {
            max_children: 3,
            ..DrainParams::default()
        });
        let lines = ["a b c d", "x y c d", "p q r s", "m n o p", "a b c e"];
        for l in lines {
            d.add(&toks(l));
        }
        let mut r = Drain::new(DrainParams {
            max_children: 3,
            ..DrainParams::default()
        });
        for c in d.clusters() {
            r.restore(c.clone());
        }
        for l in lines {
            let (x, y) = (d.best_match(&toks(l)), r.best_match(&toks(l)));
            assert_eq!(x, y, "{l}");
            assert!(x.is_some());
        }
    }

    proptest! {
        /// Lines that differ only in typed variables (numbers, durations, percentages, ids)
        /// always land in one template, whose id is the same whatever the values.
        #[test]
        fn numbers_never_split_a_template(
            values in prop::collection::vec((0u32..100_000, 0u32..1000, 0u32..10_000, 0u64..u64::MAX), 1..40),
        ) {
            let mut d = Drain::new(DrainParams::default());
            let mut ids = HashSet::new();
            for (a, b, c, h) in values {
                let line = format!(
                    "INFO 12-03 10:{:02}:{:02} [metrics.py:455] Avg prompt throughput: {a}.{} tokens/s, took {b}ms, GPU KV cache usage: {}.{}%, req 0x{h:x}",
                    b % 60, c % 60, c % 10, c % 100, b % 10
                );
                match d.add(&mask(&line).tokens) {
                    Added::New(i) | Added::Joined(i, _) => { ids.insert(d.cluster(i).id.clone()); }
                    Added::Refused => prop_assert!(false, "refused"),
                }
            }
            prop_assert_eq!(ids.len(), 1);
            prop_assert_eq!(d.clusters().len(), 1);
            prop_assert!(!d.cluster(0).tokens.iter().any(|t| t == WILDCARD), "{}", d.cluster(0).text());
        }

        /// Whatever the input, a line just added is known: adding it again joins a template,
        /// and there are never more templates than distinct lines.
        #[test]
        fn a_line_just_added_is_known(lines in prop::collection::vec("[a-c ]{1,12}", 1..30)) {
            let mut d = Drain::new(DrainParams::default());
            let mut distinct = HashSet::new();
            for l in &lines {
                let t = toks(l);
                if t.is_empty() { continue; }
                distinct.insert(t.clone());
                prop_assert!(!matches!(d.add(&t), Added::Refused));
                prop_assert!(matches!(d.add(&t), Added::Joined(_, _)), "{l:?}");
            }
            prop_assert!(d.clusters().len() <= distinct.len());
        }
    }
}
