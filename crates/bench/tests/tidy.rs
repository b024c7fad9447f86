//! House rules checked by machine: every source file of the crate opens with a `//!` paragraph
//! saying what it is for, and every `unsafe` block is preceded by a `// SAFETY:` comment
//! (clippy checks blocks; this also catches `unsafe impl` and keeps the rule visible here).

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_file_documents_itself_and_every_unsafe_has_a_safety_comment() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "tests", "examples"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() >= 15, "found only {} files", files.len());
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        assert!(
            text.starts_with("//!"),
            "{} must start with a //! module doc",
            file.display()
        );
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            // Spelled in pieces so this file does not match itself.
            if code.contains(concat!("unsafe", " {")) || code.contains(concat!("unsafe", " impl")) {
                let window = &lines[i.saturating_sub(4)..=i];
                assert!(
                    window.iter().any(|l| l.contains("SAFETY:")),
                    "{}:{} unsafe without a SAFETY comment just above",
                    file.display(),
                    i + 1
                );
            }
        }
    }
}
