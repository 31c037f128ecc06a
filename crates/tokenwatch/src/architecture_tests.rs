// The stages' order, enforced: every top-level module of the crate has a stage, and a module may
// name (`crate::…`) only modules of its own or an earlier stage — except the known back-imports
// listed here, each with why it is still there. A new back-import fails the test; so does a
// listed one that is gone (the list only shrinks). Data flows kernel → sources → pipeline →
// export → detect/alert → act → API → assembly (issue 29).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each top-level module's stage (lower: earlier; a module may import its own stage and lower).
const STAGES: &[(&str, u8)] = &[
    // The kernel: what every stage may import (the clock, records and signals are in the
    // tokenwatch-core crate).
    ("kernel", 0),
    ("runtimes", 0),
    ("writer_id", 0),
    ("traffic", 0),
    ("listen", 0),
    ("auth", 0),
    ("audit", 0),
    ("capture", 0),
    // Sources, and the transforms between them and the pipeline.
    ("sources", 1),
    ("embed", 1),
    ("logs", 1),
    ("pipeline", 2),
    ("export", 3),
    // Detect, alert and deliver.
    ("markers", 4),
    ("alerting", 4),
    // Act on what the detectors decided (reached from them through `kernel::actions`).
    ("act", 5),
    // What users read.
    ("api", 6),
    ("dashboards", 6),
    ("ui", 6),
    // Assembly: configuration, start, reload, the commands.
    ("config", 7),
    ("reload", 7),
    ("app", 7),
    ("demo", 8),
    ("top", 8),
    ("architecture_tests", 9),
];

/// Known imports of a later stage: (from, to, why it is still there). None left: a new one
/// needs a port or a kernel type instead, or a reason written here.
const KNOWN: &[(&str, &str, &str)] = &[];

fn stage(module: &str) -> Option<u8> {
    STAGES.iter().find(|(m, _)| *m == module).map(|(_, s)| *s)
}

/// The text of a source file that is product code: its `#[cfg(test)] mod tests` (conventionally
/// last) cut off, `//` comments removed.
fn product_code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]" {
            let next = lines.peek().map(|l| l.trim()).unwrap_or("");
            if next.starts_with("mod tests") || next.starts_with("#[path") {
                break;
            }
        }
        let code = line.split("//").next().unwrap_or("");
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Every `crate::<module>` a text names.
fn named_modules(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let boundary = rest[..i]
            .chars()
            .last()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        if boundary && !name.is_empty() {
            out.insert(name);
        }
        rest = after;
    }
    out
}

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// (from module, to module) → the files naming the later stage.
fn back_imports() -> BTreeMap<(String, String), Vec<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    assert!(
        files.len() > 100,
        "read {} files under {src:?}",
        files.len()
    );
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for f in files {
        let rel = f
            .strip_prefix(&src)
            .expect("under src")
            .to_string_lossy()
            .replace('\\', "/");
        let name = rel.rsplit('/').next().unwrap_or("");
        if name.ends_with("_tests.rs") || name == "tests.rs" || rel.contains("/tests/") {
            continue;
        }
        let top = rel.split('/').next().unwrap_or("").trim_end_matches(".rs");
        if top == "lib" || top == "main" {
            continue;
        }
        let Some(from) = stage(top) else {
            panic!("src/{rel}: module `{top}` has no stage: add it to STAGES");
        };
        let text = std::fs::read_to_string(&f).expect("readable");
        for to in named_modules(&product_code(&text)) {
            if let Some(s) = stage(&to)
                && s > from
            {
                out.entry((top.to_string(), to))
                    .or_default()
                    .push(rel.clone());
            }
        }
    }
    out
}

#[test]
fn no_module_imports_a_later_stage_beyond_the_known_ones() {
    let found = back_imports();
    let known: BTreeSet<(String, String)> = KNOWN
        .iter()
        .map(|(a, b, _)| (a.to_string(), b.to_string()))
        .collect();
    let new: Vec<String> = found
        .iter()
        .filter(|(k, _)| !known.contains(*k))
        .map(|((a, b), files)| format!("{a} → {b} ({})", files.join(", ")))
        .collect();
    assert!(
        new.is_empty(),
        "imports of a later stage (data flows kernel → sources → pipeline → export → \
         detect/alert → act → API → assembly): {new:#?}; take what they need through a port or a \
         type in the kernel instead"
    );
    let gone: Vec<String> = known
        .iter()
        .filter(|k| !found.contains_key(*k))
        .map(|(a, b)| format!("{a} → {b}"))
        .collect();
    assert!(
        gone.is_empty(),
        "known back-imports that are gone: {gone:?} — remove them from KNOWN"
    );
}

#[test]
fn the_scanner_sees_imports_and_skips_tests_and_comments() {
    let text = "use crate::kernel::x;\n// crate::api in a comment\nfn f() { crate::sources::g(); }\nlet s = notcrate::alerting;\n#[cfg(test)]\nmod tests {\n    use crate::app;\n}\n";
    let names = named_modules(&product_code(text));
    assert_eq!(
        names,
        BTreeSet::from(["kernel".to_string(), "sources".to_string()])
    );
    assert_eq!(stage("sources"), Some(1));
    assert_eq!(stage("nope"), None);
}
