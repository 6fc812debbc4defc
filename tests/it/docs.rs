//! The documents point at files that exist: every repository path named
//! in ARCHITECTURE.md (its code map above all), README.md and
//! RELIABILITY.md, and every link to a local file in the Markdown pages
//! at the root and under `docs/`. The code map also names every source
//! file under `src/`.

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
