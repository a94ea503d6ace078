//! Every source file a comment or a document names exists: a move that leaves `answers.rs` in a
//! comment after the file went to `frontend/answers.rs` fails here, not in a newcomer's search.
//!
//! A name is a word ending in `.rs`. It resolves when it exists relative to the repository root or to
//! `src/`; in a source file also relative to the file's folder, any folder above it, or anywhere
//! below it (a module doc names the files of its folder by their bare names); in a document, a bare
//! name also resolves when some source file has that name (the section says which folder).
//! `docs/performance.md` is a dated log of measurements: it names files as they were when each was
//! taken, and is not checked.

use std::path::{Path, PathBuf};

#[test]
fn every_source_file_named_in_comments_and_docs_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources = Vec::new();
    for dir in ["src", "tests", "benches"] {
        collect(&root.join(dir), &mut sources);
    }
    for doc in ["README.md", "docs"] {
        collect(&root.join(doc), &mut sources);
    }
    sources.retain(|p| p.file_name().is_none_or(|n| n != "performance.md"));
    assert!(sources.len() > 100, "only {} files read: did the tree move?", sources.len());
    let mut missing = Vec::new();
    for file in sources.iter().filter(|f| !f.ends_with("tests/it/doc_paths.rs")) {
        let text = std::fs::read_to_string(file).unwrap();
        let markdown = file.extension().is_some_and(|e| e == "md");
        for (line, name) in named_rust_files(&text, markdown) {
            if !resolves(root, file, &name, markdown) {
                missing.push(format!("{}:{line}: {name}", file.strip_prefix(root).unwrap().display()));
            }
        }
    }
    assert!(missing.is_empty(), "{} names of files that do not exist:\n{}", missing.len(), missing.join("\n"));
}

#[test]
fn the_path_reader_finds_names_and_resolves_them() {
    let text = "//! see `frontend/answers.rs` and `rules.rs`;\nlet x = \"a.rs\"; // (store.rs) and foo_bar.rs.\n";
    let names: Vec<_> = named_rust_files(text, false).into_iter().map(|(_, n)| n).collect();
    assert_eq!(names, ["frontend/answers.rs", "rules.rs", "store.rs", "foo_bar.rs"]);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let identity = root.join("src/identity/mod.rs");
    assert!(resolves(root, &identity, "rules.rs", false), "a sibling");
    assert!(resolves(root, &identity, "frontend/answers.rs", false), "from src/");
    assert!(resolves(root, &identity, "tests/it/doc_paths.rs", false), "from the root");
    assert!(resolves(root, &root.join("src/frontend/mod.rs"), "reload.rs", false), "below its folder");
    assert!(!resolves(root, &identity, "answers.rs", false), "not beside it, above it or below it");
    let doc = root.join("docs/architecture.md");
    assert!(resolves(root, &doc, "answers.rs", true), "a source file of that name");
    assert!(!resolves(root, &doc, "frontend/identity.rs", true), "a path must be whole");
    assert!(!resolves(root, &doc, "tests/gateway.rs", true));
}

/// Files under `path` (or `path` itself) that are Rust sources or Markdown.
fn collect(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_file() {
        if path.extension().is_some_and(|e| e == "rs" || e == "md") {
            out.push(path.to_path_buf());
        }
        return;
    }
    let Ok(dir) = std::fs::read_dir(path) else { return };
    for entry in dir.flatten() {
        collect(&entry.path(), out);
    }
}

/// `(line, name)` for each word ending in `.rs` made of path characters. Markdown is read whole; in
/// Rust sources only comments are (a string such as `"main.rs"` in code names a file a test creates).
fn named_rust_files(text: &str, markdown: bool) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let read = match line.find("//") {
            _ if markdown => line,
            Some(at) => &line[at..],
            None => continue,
        };
        let mut word = String::new();
        for c in read.chars().chain(std::iter::once(' ')) {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '/' | '.' | '-') {
                word.push(c);
                continue;
            }
            let name = word.trim_end_matches('.').trim_start_matches("./");
            if name.ends_with(".rs") && name.len() > 3 && !name.contains("..") && !name.starts_with('/') {
                out.push((i + 1, name.to_string()));
            }
            word.clear();
        }
    }
    out
}

fn resolves(root: &Path, file: &Path, name: &str, markdown: bool) -> bool {
    if root.join(name).is_file() || root.join("src").join(name).is_file() || name == "mod.rs" {
        return true;
    }
    if markdown {
        return !name.contains('/') && [root.join("src"), root.join("tests")].iter().any(|d| found_below(d, name));
    }
    let here = file.parent().unwrap_or(root);
    if found_below(here, name) {
        return true;
    }
    here.ancestors().take_while(|d| d.starts_with(root)).any(|d| d.join(name).is_file())
}

/// Whether `dir` or a folder below it holds `name` (a bare file name or a relative path).
fn found_below(dir: &Path, name: &str) -> bool {
    if dir.join(name).is_file() {
        return true;
    }
    std::fs::read_dir(dir).into_iter().flatten().flatten().any(|e| e.path().is_dir() && found_below(&e.path(), name))
}
