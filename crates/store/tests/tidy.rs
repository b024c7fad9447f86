//! Tidy checks run by `cargo test`: every source file opens with a `//!` paragraph saying what it
//! is for, and every `unsafe` block in the crate's tests carries a `// SAFETY:` comment (the
//! library itself forbids unsafe code).

use std::path::Path;

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
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
fn every_file_has_a_module_doc_and_unsafe_has_safety_comments() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "tests", "examples"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 10, "found only {files:?}");
    // Built at run time so this file does not match itself.
    let needle = ["unsafe", " {"].concat();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            text.starts_with("//!"),
            "{} does not start with a //! module doc",
            f.display()
        );
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            if code.contains(&needle) {
                let context = lines[i.saturating_sub(3)..i].join("\n");
                assert!(
                    context.contains("SAFETY:"),
                    "{}:{} unsafe block without // SAFETY:",
                    f.display(),
                    i + 1
                );
            }
        }
    }
}
