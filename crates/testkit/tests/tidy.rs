//! House rules of the whole workspace, checked by machine (one test, for every crate):
//!
//! - every Rust file opens with a `//!` paragraph saying what it is for;
//! - every crate root denies or forbids `unsafe_code`, and every `unsafe` block or impl has a
//!   `// SAFETY:` comment just above it;
//! - no `.unwrap()` in library or binary code outside its tests (an `.expect("why")` names
//!   the invariant instead);
//! - no leftover to-do markers in code;
//! - no Rust file is longer than [`LINES_MAX`];
//! - every relative link in the Markdown documents resolves to a file of the repository.

use std::fs;
use std::path::{Path, PathBuf};

/// Longest Rust file, in lines.
const LINES_MAX: usize = 800;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("crates/testkit sits two levels below the workspace root")
}

/// Files under `dir` whose name ends with `ext`, skipping build output and fuzz corpora.
fn files(dir: &Path, ext: &str, found: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            let skip = ["target", "corpus", "artifacts", ".git", "node_modules"];
            if !skip.iter().any(|s| name == *s) {
                files(&path, ext, found);
            }
        } else if name.to_string_lossy().ends_with(ext) {
            found.push(path);
        }
    }
}

fn relative(path: &Path) -> String {
    path.strip_prefix(workspace())
        .unwrap_or(path)
        .display()
        .to_string()
}

fn rust_files() -> Vec<PathBuf> {
    let mut found = Vec::new();
    files(&workspace().join("crates"), ".rs", &mut found);
    assert!(found.len() > 100, "found only {} Rust files", found.len());
    found
}

/// Whether a file is test code as a whole (integration tests, benches, examples, fuzz
/// targets, a `tests.rs` module).
fn is_test_file(rel: &str) -> bool {
    ["/tests/", "/benches/", "/examples/", "/fuzz/"]
        .iter()
        .any(|d| rel.contains(d))
        || rel.ends_with("/tests.rs")
}

/// The code of a line: what precedes a `//` comment (good enough for these checks: a `//`
/// inside a string literal only hides the rest of that line).
fn code(line: &str) -> &str {
    line.split("//").next().unwrap_or("")
}

#[test]
fn every_rust_file_follows_the_house_rules() {
    // Built at run time so this file does not match itself.
    let unsafe_block = ["unsafe", " {"].concat();
    let unsafe_impl = ["unsafe", " impl"].concat();
    let unwrap = [".unwrap", "()"].concat();
    let markers = [
        ["TO", "DO"].concat(),
        ["FIX", "ME"].concat(),
        ["X", "XX"].concat(),
    ];
    let mut problems = Vec::new();
    for path in rust_files() {
        let rel = relative(&path);
        let text = fs::read_to_string(&path).expect("a readable source file");
        if !text.starts_with("//!") {
            problems.push(format!("{rel}: does not open with a //! module doc"));
        }
        let lines: Vec<&str> = text.lines().collect();
        if lines.len() > LINES_MAX {
            problems.push(format!(
                "{rel}: {} lines, more than {LINES_MAX}: split it",
                lines.len()
            ));
        }
        let mut in_tests = is_test_file(&rel);
        for (i, line) in lines.iter().enumerate() {
            if line.trim() == "#[cfg(test)]" {
                in_tests = true;
            }
            let c = code(line);
            if c.contains(&unsafe_block) || c.trim_start().starts_with(&unsafe_impl) {
                let above = lines[i.saturating_sub(4)..=i].join("\n");
                if !above.contains("SAFETY:") {
                    problems.push(format!("{rel}:{}: unsafe without // SAFETY:", i + 1));
                }
            }
            if !in_tests && c.contains(&unwrap) {
                problems.push(format!(
                    "{rel}:{}: unwrap outside tests (say why it cannot fail with expect, or handle it)",
                    i + 1
                ));
            }
            if markers.iter().any(|m| line.contains(m.as_str())) {
                problems.push(format!("{rel}:{}: leftover marker: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn every_crate_root_denies_unsafe_code() {
    let mut roots = Vec::new();
    for entry in fs::read_dir(workspace().join("crates")).expect("crates/") {
        let dir = entry.expect("an entry of crates/").path();
        for root in ["src/lib.rs", "src/main.rs"] {
            if dir.join(root).exists() {
                roots.push(dir.join(root));
            }
        }
    }
    assert!(roots.len() >= 9, "{roots:?}");
    for root in roots {
        let text = fs::read_to_string(&root).expect("a crate root");
        assert!(
            text.contains("#![forbid(unsafe_code)]") || text.contains("#![deny(unsafe_code)]"),
            "{} neither forbids nor denies unsafe_code",
            relative(&root)
        );
    }
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = workspace();
    let mut docs = Vec::new();
    for dir in ["docs", "deploy", "tests", "scripts"] {
        files(&root.join(dir), ".md", &mut docs);
    }
    files(&root.join("crates"), ".md", &mut docs);
    for top in ["README.md", "ARCHITECTURE.md"] {
        docs.push(root.join(top));
    }
    let mut broken = Vec::new();
    for doc in &docs {
        let text = fs::read_to_string(doc).expect("a readable document");
        for (i, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(at) = rest.find("](") {
                rest = &rest[at + 2..];
                let Some(end) = rest.find(')') else { break };
                let target = &rest[..end];
                rest = &rest[end..];
                let is_url = target.contains("://") || target.starts_with("mailto:");
                if is_url || target.starts_with('#') || target.contains(' ') {
                    continue;
                }
                let file = target.split('#').next().unwrap_or(target);
                let dir = doc.parent().expect("a document lies in a directory");
                if !dir.join(file).exists() {
                    broken.push(format!("{}:{}: {target}", relative(doc), i + 1));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
