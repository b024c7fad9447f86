//! Tidy checks run by `cargo test`: every source file of this crate starts with a `//!`
//! paragraph saying what it is for, and none uses `unsafe` (the library is
//! `#![forbid(unsafe_code)]`; this keeps the binary and the tests honest too).

use std::fs;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn every_source_file_has_a_module_doc_and_no_unsafe() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "tests", "examples"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() >= 12, "tidy found too few files: {files:?}");
    let unsafe_word = ["un", "safe "].concat();
    for file in files {
        let text = fs::read_to_string(&file).expect("readable source");
        assert!(
            text.starts_with("//!"),
            "{} must start with a //! module doc",
            file.display()
        );
        assert!(
            !text.contains(&unsafe_word),
            "{} contains {unsafe_word:?}",
            file.display()
        );
    }
}
