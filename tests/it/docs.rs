//! The documents point at files that exist: every repository path named
//! in ARCHITECTURE.md (its code map above all), README.md and
//! RELIABILITY.md, and every link to a local file in the Markdown pages
//! at the root and under `docs/`. The code map also names every source
//! file under `src/`. And the invariants of ARCHITECTURE.md that a scan of
//! the source can check hold: the engine reads no clock but its `Clock`,
//! storage imports nothing from the engine, imports run down the layers
//! only (root, front ends, their kit, engine, storage), only storage names
//! sled, and only the front ends (with their kit, the client and the
//! generated code) name axum or tonic.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Where a backticked path must start to be taken for a repository path.
const ROOTS: &[&str] = &[
    "src/",
    "tests/",
    "tools/",
    "vendor/",
    "docs/",
    "proto/",
    "packaging/",
    "examples/",
    "benches/",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The text of a Markdown document outside its fenced code blocks.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The inline code spans of a document that look like repository paths:
/// one of [`ROOTS`] first, no spaces, no placeholders (`<id>`, `*`, `{x}`).
fn code_paths(text: &str) -> Vec<String> {
    prose(text)
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| ROOTS.iter().any(|r| s.starts_with(r)))
        .filter(|s| !s.contains(|c: char| c.is_whitespace() || "<>*{}…".contains(c)))
        .map(str::to_string)
        .collect()
}

/// The targets of a document's Markdown links to local files
/// (`[text](path)` or `[text](path#anchor)`), anchors cut off.
fn local_links(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = &rest[..end];
        rest = &rest[end..];
        let is_url = target
            .split_once(':')
            .is_some_and(|(scheme, _)| scheme.chars().all(|c| c.is_ascii_alphabetic()));
        if target.is_empty() || target.starts_with('#') || is_url || target.contains(' ') {
            continue;
        }
        let path = target.split('#').next().unwrap_or(target);
        out.push(path.to_string());
    }
    out
}

/// Every Markdown page at the root and under `docs/`, relative paths.
fn pages() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut found = Vec::new();
    for entry in std::fs::read_dir(root()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() && path.extension().is_some_and(|e| e == "md") {
            found.push(path);
        }
    }
    walk(&root().join("docs"), &mut found);
    let mut pages: Vec<String> = found
        .iter()
        .map(|p| {
            p.strip_prefix(root())
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    pages.sort();
    pages
}

#[test]
fn every_path_the_documents_name_exists() {
    let mut missing = Vec::new();
    let mut named = 0;
    for doc in ["ARCHITECTURE.md", "README.md", "RELIABILITY.md"] {
        for path in code_paths(&read(doc)) {
            named += 1;
            if !root().join(&path).exists() {
                missing.push(format!("{doc}: `{path}`"));
            }
        }
    }
    assert!(
        named > 100,
        "only {named} paths found: is the pattern right?"
    );
    assert!(
        missing.is_empty(),
        "paths named in the documents that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_local_link_of_the_documents_resolves() {
    let pages = pages();
    for page in ["README.md", "RELIABILITY.md", "ARCHITECTURE.md"] {
        assert!(pages.iter().any(|p| p == page), "{page} not found");
    }
    let mut missing = Vec::new();
    let mut links = 0;
    for page in &pages {
        let dir = Path::new(page).parent().unwrap_or(Path::new(""));
        for link in local_links(&read(page)) {
            links += 1;
            if !root().join(dir).join(&link).exists() {
                missing.push(format!("{page}: ]({link})"));
            }
        }
    }
    assert!(
        links > 50,
        "only {links} links found: is the pattern right?"
    );
    assert!(
        missing.is_empty(),
        "links to local files that do not exist:\n{}",
        missing.join("\n")
    );
}

/// The code map names each source file, or only the directory of a module
/// it describes as a whole (no file of that directory named).
#[test]
fn the_code_map_names_every_source_file() {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(
                    path.strip_prefix(root())
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    let named: BTreeSet<String> = code_paths(&read("ARCHITECTURE.md")).into_iter().collect();
    let mut files = Vec::new();
    walk(&root().join("src"), &mut files);
    files.sort();
    let unnamed: Vec<&String> = files
        .iter()
        .filter(|file| {
            if named.contains(*file) {
                return false;
            }
            let dir = format!("{}/", Path::new(file).parent().unwrap().display());
            let dir_alone = named.contains(&dir)
                && !named
                    .iter()
                    .any(|n| n.len() > dir.len() && n.starts_with(&dir));
            !dir_alone
        })
        .collect();
    assert!(
        unnamed.is_empty(),
        "source files ARCHITECTURE.md's code map does not name (give each a line, \
         or name only its directory):\n{}",
        unnamed
            .iter()
            .map(|f| f.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

// The invariants of ARCHITECTURE.md that a scan of the source can check.
// Each is phrased as an absence; `the_invariant_scans_find_what_they_look_for`
// shows on a sample that each scan finds what breaks its rule.

/// The code of a Rust source: comments and the contents of string and
/// character literals blanked (newlines kept), so that a name written in
/// them is not taken for one the code uses.
fn code_of(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if c[i] == 'r' && (i == 0 || !ident(c[i - 1])) && matches!(next, Some('"' | '#')) {
            // A raw string: r"...", r#"..."#.
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            let close: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            out.extend(&c[i..=j]);
            i = j + 1;
            while i < c.len() && !c[i..].starts_with(&close.chars().collect::<Vec<_>>()) {
                out.push(blank(c[i]));
                i += 1;
            }
        } else if c[i] == '"' {
            out.push('"');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
            if i < c.len() {
                out.push('"');
                i += 1;
            }
        } else if c[i] == '\'' && (next == Some('\\') || c.get(i + 2) == Some(&'\'')) {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime.
            out.push('\'');
            i += 1;
            if c.get(i) == Some(&'\\') {
                out.push_str("  ");
                i += 2;
            }
            while i < c.len() && c[i] != '\'' {
                out.push(' ');
                i += 1;
            }
            if i < c.len() {
                out.push('\'');
                i += 1;
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// Where in `code` (lines from 1) a path or name in `needles` is written
/// whole: no identifier character just before it (unless the needle
/// starts with punctuation) nor just after it (unless it ends with some).
fn written(code: &str, needles: &[&str]) -> Vec<(usize, String)> {
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        for needle in needles {
            for (at, _) in line.match_indices(needle) {
                let before = line[..at].chars().next_back();
                let after = line[at + needle.len()..].chars().next();
                let open_start = needle.starts_with(|c: char| !ident(c));
                let open_end = needle.ends_with(|c: char| !ident(c));
                if (!open_start && before.is_some_and(ident))
                    || (!open_end && after.is_some_and(ident))
                {
                    continue;
                }
                if out.last().is_none_or(|(l, _)| *l != n + 1) {
                    out.push((n + 1, line.trim().to_string()));
                }
            }
        }
    }
    out
}

/// The crates a piece of code names by path (`tonic::…`, `use axum…`):
/// every identifier that starts a path or follows `use`, taken as is.
fn crates_named(code: &str, crates: &[&str]) -> Vec<(usize, String)> {
    let mut needles = Vec::new();
    for c in crates {
        needles.push(format!("{c}::"));
        needles.push(format!("use {c}"));
        needles.push(format!("extern crate {c}"));
    }
    let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
    written(code, &needles)
}

/// Every `.rs` file under the repository directory `dir`, sorted.
fn rust_files(dir: &str) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut found = Vec::new();
    walk(&root().join(dir), &mut found);
    let mut files: Vec<String> = found
        .iter()
        .map(|p| {
            p.strip_prefix(root())
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    files.sort();
    files
}

/// Every place `scan` finds in the code of `files`, as `file:line: text`.
fn violations(files: &[String], scan: impl Fn(&str, &str) -> Vec<(usize, String)>) -> Vec<String> {
    assert!(!files.is_empty(), "no file to check");
    let mut found = Vec::new();
    for file in files {
        for (line, text) in scan(file, &code_of(&read(file))) {
            found.push(format!("{file}:{line}: {text}"));
        }
    }
    found
}

/// Fails naming every place `scan` finds in `files` (`rule` says what is
/// broken).
fn check(rule: &str, files: &[String], scan: impl Fn(&str, &str) -> Vec<(usize, String)>) {
    let found = violations(files, scan);
    assert!(found.is_empty(), "{rule}:\n{}", found.join("\n"));
}

/// A test file of the engine (timing checks may read real time there).
fn is_test_file(file: &str) -> bool {
    file.ends_with("/tests.rs") || file.ends_with("_tests.rs")
}

/// What reads the clock without going through `Clock`.
const CLOCK_READS: &[&str] = &["Instant::now", "SystemTime::now", ".elapsed()"];

#[test]
fn the_engine_reads_time_only_through_its_clock() {
    let engine: Vec<String> = rust_files("src/queue")
        .into_iter()
        .filter(|f| !is_test_file(f))
        .collect();
    check(
        "src/queue/ reads time only through Clock (src/clock.rs)",
        &engine,
        |_, code| written(code, CLOCK_READS),
    );
}

/// Where `super::` chains in `code` reach the crate's root from `file`'s
/// module and go on to `module` (`super::super::queue` from
/// `src/storage/verify/mod.rs` is `crate::queue`).
fn supers_to(file: &str, code: &str, module: &str) -> Vec<(usize, String)> {
    let rel = file.trim_start_matches("src/").trim_end_matches(".rs");
    let depth = rel.trim_end_matches("/mod").split('/').count();
    written(code, &[&format!("{}{module}", "super::".repeat(depth))])
}

#[test]
fn storage_imports_nothing_from_the_engine() {
    check(
        "src/storage/ imports nothing from the engine (crate::queue)",
        &rust_files("src/storage"),
        |file, code| {
            let mut found = written(code, &["crate::queue", "letterbox::queue"]);
            found.extend(supers_to(file, code, "queue"));
            found
        },
    );
}

#[test]
fn only_storage_names_sled() {
    let others: Vec<String> = rust_files("src")
        .into_iter()
        .filter(|f| !f.starts_with("src/storage/"))
        .collect();
    check("only src/storage/ names sled", &others, |_, code| {
        crates_named(code, &["sled"])
    });
}

/// The modules that may name the HTTP and gRPC frameworks: the front
/// ends, what they share, the client and the generated code.
const FRAMEWORK_USERS: &[&str] = &[
    "src/grpc/",
    "src/anypoint/",
    "src/sqs/",
    "src/console/",
    "src/metrics.rs",
    "src/edge/",
    "src/client/",
    "src/pb.rs",
];

/// The crates of the HTTP and gRPC frameworks.
const FRAMEWORKS: &[&str] = &[
    "tonic",
    "tonic_health",
    "tonic_reflection",
    "tonic_prost",
    "axum",
    "axum_extra",
];

#[test]
fn only_front_ends_name_axum_or_tonic() {
    let others: Vec<String> = rust_files("src")
        .into_iter()
        .filter(|f| !FRAMEWORK_USERS.iter().any(|u| f.starts_with(u)))
        .collect();
    check(
        "only the front ends (src/grpc/, src/anypoint/, src/sqs/, src/console/, src/metrics.rs, \
         src/edge/), src/client/ and src/pb.rs name axum or tonic",
        &others,
        |_, code| crates_named(code, FRAMEWORKS),
    );
}

/// The layers of `src/`, top down: the composition root, the front ends,
/// their shared kit, the engine, storage.
const LAYERS: &[&[&str]] = &[
    &["server"],
    &["grpc", "anypoint", "sqs", "console", "metrics"],
    &["edge"],
    &["queue"],
    &["storage"],
];

/// The files of the top-level module `m` (`src/m/` or `src/m.rs`).
fn module_files(m: &str) -> Vec<String> {
    let file = format!("src/{m}.rs");
    if root().join(&file).exists() {
        vec![file]
    } else {
        rust_files(&format!("src/{m}"))
    }
}

#[test]
fn imports_run_down_the_layers_only() {
    let mut found = Vec::new();
    for (k, layer) in LAYERS.iter().enumerate() {
        for m in *layer {
            // The layers above and the others of its own.
            let forbidden: Vec<&str> = LAYERS[..=k]
                .iter()
                .flat_map(|l| l.iter().copied())
                .filter(|x| x != m)
                .collect();
            found.extend(violations(&module_files(m), |file, code| {
                let mut found = Vec::new();
                for x in &forbidden {
                    found.extend(written(code, &[&format!("crate::{x}")]));
                    found.extend(supers_to(file, code, x));
                }
                found
            }));
        }
    }
    assert!(
        found.is_empty(),
        "imports run down the layers only ({LAYERS:?}, top down; none between the \
         modules of one layer):\n{}",
        found.join("\n")
    );
}

/// The scans above, on samples: each finds what breaks its rule in code,
/// and nothing in comments or strings.
#[test]
fn the_invariant_scans_find_what_they_look_for() {
    let sample = r#"
        // Instant::now() in a comment; use tonic::Status;
        /* sled::open(), /* nested */ axum::Router */
        let s = "Instant::now() tonic::Code sled::Db";
        let c = '"'; let l: &'static str = "x";
        let t = std::time::Instant::now();
        let d = started.elapsed();
        use tonic_health::server;
        let db = sled::open(p);
        let q = crate::queue::Broker::open();
        let r = super::super::queue::model::QueueKind::Fifo;
        let fine = my_sled::open(); let also = Instant::nowhere;
    "#;
    let code = code_of(sample);
    let lines = |found: Vec<(usize, String)>| found.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    assert_eq!(lines(written(&code, CLOCK_READS)), [6, 7]);
    assert_eq!(lines(crates_named(&code, FRAMEWORKS)), [8]);
    assert_eq!(lines(crates_named(&code, &["sled"])), [9]);
    assert_eq!(lines(written(&code, &["crate::queue"])), [10]);
    assert_eq!(
        lines(supers_to("src/storage/verify/mod.rs", &code, "queue")),
        [11]
    );
    assert!(supers_to("src/storage/verify/scan.rs", &code, "queue").is_empty());
}

/// The audit log as docs/configuration.md describes it: every action the
/// front ends record, and every field of an event.
#[test]
fn the_audit_log_is_documented_whole() {
    let doc = read("docs/configuration.md");
    let section = doc
        .split("## Logs and the audit log")
        .nth(1)
        .expect("docs/configuration.md has the section");
    let mut missing = Vec::new();
    let mut found = 0;
    for dir in ["src/grpc", "src/anypoint", "src/sqs", "src/console"] {
        for file in rust_files(dir) {
            let text = read(&file);
            // The actions are written as "noun.verb", the first string of
            // the call that records them.
            for (at, _) in text.match_indices("audit") {
                let call: String = text[at..].chars().take(240).collect();
                let Some(lit) = call.split('"').nth(1) else {
                    continue;
                };
                let is_action = lit.split_once('.').is_some_and(|(a, b)| {
                    !a.is_empty()
                        && !b.is_empty()
                        && lit
                            .chars()
                            .all(|c| c.is_ascii_lowercase() || c == '.' || c == '_')
                });
                if is_action {
                    found += 1;
                    if !section.contains(&format!("`{lit}`")) {
                        missing.push(format!("{file}: {lit}"));
                    }
                }
            }
        }
    }
    for field in ["action", "name", "principal", "peer", "outcome", "detail"] {
        assert!(
            read("src/edge/audit.rs").contains(&format!("{field},"))
                || read("src/edge/audit.rs").contains(&format!("{field} =")),
            "src/edge/audit.rs records {field}"
        );
        if !section.contains(&format!("| `{field}` |")) {
            missing.push(format!("field {field}"));
        }
    }
    assert!(found > 20, "only {found} audited calls found");
    assert!(missing.is_empty(), "not documented: {missing:?}");
}
