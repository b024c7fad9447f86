//! Tidy checks run by `cargo test`: every source file of the crate starts with a `//!`
//! paragraph saying what it is for (STYLE.md section 3), and no file grows past the size that
//! still reads in one sitting.

use std::fs;
use std::path::{Path, PathBuf};

/// Longest source file accepted, in lines.
const FILE_LINES_MAX: usize = 700;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .expect("readable source dir")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_file_has_a_module_doc_and_a_bounded_size() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() >= 10, "found the sources: {files:?}");
    for file in files {
        let text = fs::read_to_string(&file).expect("readable source");
        let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        assert!(
            first.starts_with("//!"),
            "{} must start with a //! module doc",
            file.display()
        );
        let lines = text.lines().count();
        assert!(
            lines <= FILE_LINES_MAX,
            "{} has {lines} lines (max {FILE_LINES_MAX})",
            file.display()
        );
    }
}
