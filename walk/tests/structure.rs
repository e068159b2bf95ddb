//! The workspace's shape, checked: no two files (or longer circles of
//! files) import each other within a crate, and no file grows past what
//! one reading takes. A circle means neither side owns what both need;
//! the fix is to move it where it belongs, not to silence this test.
//!
//! Edges are the `crate::` and `super::` paths a file names (in `use`
//! items and in code; comments left out), resolved to the file that
//! defines the module. The crate root (lib.rs, main.rs) is left out: it declares the
//! modules and re-exports the crate's facade, so every file is its child.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A source file may be this long (lines), a test file this long.
const SOURCE_LIMIT: usize = 850;
const TEST_LIMIT: usize = 1_550;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The workspace's member crates (their directories), from Cargo.toml.
fn members() -> Vec<PathBuf> {
    let text = std::fs::read_to_string(workspace().join("Cargo.toml")).unwrap();
    let list = text
        .split("members = [")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .expect("Cargo.toml lists the workspace members");
    list.split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|m| workspace().join(m))
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file below `src/`: `a/b.rs` and `a/b/mod.rs` are
/// `[a, b]`; the roots are `[]`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") || !parts.is_empty() && stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

/// The identifier paths that follow `prefix` in `text`, with `{a, b::c}`
/// groups expanded: `crate::x::{y, z::w}` gives `[x, y]` and `[x, z, w]`.
fn paths_after(text: &str, prefix: &str) -> Vec<Vec<String>> {
    fn skip_space(s: &str, mut i: usize) -> usize {
        while s[i..].starts_with(char::is_whitespace) {
            i += 1;
        }
        i
    }
    fn path(s: &str, base: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
        let bytes = s.as_bytes();
        let mut i = 0;
        let mut cur = base;
        loop {
            if s[i..].starts_with('{') {
                // a group: each entry a path from here
                i += 1;
                loop {
                    i = skip_space(s, i);
                    if i >= bytes.len() {
                        return i;
                    }
                    if bytes[i] == b'}' {
                        return i + 1;
                    }
                    i += path(&s[i..], cur.clone(), out);
                    i = skip_space(s, i);
                    if i < bytes.len() && bytes[i] == b',' {
                        i += 1;
                    }
                }
            }
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            if i > start {
                cur.push(s[start..i].to_string());
            }
            if s[i..].starts_with("::") {
                i += 2;
                continue;
            }
            out.push(cur);
            return i;
        }
    }
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let used = path(rest, Vec::new(), &mut out);
        rest = &rest[used.min(rest.len())..];
    }
    out
}

/// The file-level import graph of one crate: file -> files it names.
fn graph(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(src, f), f.clone()))
        .collect();
    // the file defining the longest module prefix of a path
    let resolve = |path: &[String]| -> Option<&PathBuf> {
        (1..=path.len()).rev().find_map(|n| modules.get(&path[..n]))
    };
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for file in &files {
        let me = module_of(src, file);
        if me.is_empty() {
            continue;
        }
        // comments (doc links among them) import nothing
        let text: String = std::fs::read_to_string(file)
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut named: Vec<Vec<String>> = paths_after(&text, "crate::");
        // `super::` at the top level of a file is its parent module;
        // inside an inline module (rustfmt indents it) it is the file
        // itself, which is no edge
        for line in text.lines().filter(|l| !l.starts_with(char::is_whitespace)) {
            for p in paths_after(line, "super::") {
                let mut base = me[..me.len() - 1].to_vec();
                let mut p = p.as_slice();
                while p.first().is_some_and(|s| s == "super") {
                    base.pop();
                    p = &p[1..];
                }
                base.extend(p.iter().cloned());
                named.push(base);
            }
        }
        for p in named {
            if let Some(target) = resolve(&p)
                && target != file
                && !module_of(src, target).is_empty()
            {
                edges
                    .entry(file.clone())
                    .or_default()
                    .insert(target.clone());
            }
        }
    }
    edges
}

/// The strongly connected components of more than one file (Tarjan).
fn circles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        found: Vec<Vec<PathBuf>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a PathBuf) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found
}

#[test]
fn no_two_files_of_a_crate_import_each_other() {
    let mut found = Vec::new();
    for crate_dir in members() {
        let src = crate_dir.join("src");
        for circle in circles(&graph(&src)) {
            let names: Vec<String> = circle
                .iter()
                .map(|f| f.strip_prefix(workspace()).unwrap().display().to_string())
                .collect();
            found.push(names.join(" <-> "));
        }
    }
    assert!(
        found.is_empty(),
        "files that import each other (move what both need where it belongs):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checker_finds_a_circle_and_resolves_groups_and_super() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\npub mod c;\n").unwrap();
    std::fs::write(
        src.join("a/mod.rs"),
        "pub mod inner;\nuse crate::{b::X, c};\n",
    )
    .unwrap();
    std::fs::write(
        src.join("a/inner.rs"),
        "use super::Y;\nmod tests {\n    use super::*;\n}\n",
    )
    .unwrap();
    std::fs::write(
        src.join("b.rs"),
        "pub struct X;\nfn f() { crate::a::inner::g(); }\n",
    )
    .unwrap();
    std::fs::write(src.join("c.rs"), "pub struct Z;\n").unwrap();
    let g = graph(&src);
    let names = |f: &PathBuf| f.strip_prefix(&src).unwrap().display().to_string();
    let edges: BTreeSet<(String, String)> = g
        .iter()
        .flat_map(|(f, ts)| ts.iter().map(move |t| (names(f), names(t))))
        .collect();
    let expected: BTreeSet<(String, String)> = [
        ("a/mod.rs", "b.rs"),
        ("a/mod.rs", "c.rs"),
        ("a/inner.rs", "a/mod.rs"),
        ("b.rs", "a/inner.rs"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(edges, expected);
    let found = circles(&g);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        found[0].iter().map(&names).collect::<Vec<_>>(),
        ["a/inner.rs", "a/mod.rs", "b.rs"]
    );
}

#[test]
fn no_file_grows_past_one_reading() {
    let mut long = Vec::new();
    for crate_dir in members() {
        for (dir, limit) in [
            ("src", SOURCE_LIMIT),
            ("tests", TEST_LIMIT),
            ("benches", TEST_LIMIT),
        ] {
            let mut files = Vec::new();
            rust_files(&crate_dir.join(dir), &mut files);
            for f in files {
                let lines = std::fs::read_to_string(&f).unwrap().lines().count();
                if lines > limit {
                    let rel = f.strip_prefix(workspace()).unwrap();
                    long.push(format!("{} ({lines} lines; limit {limit})", rel.display()));
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "files past one reading (split them where their own structure cuts them):\n{}",
        long.join("\n")
    );
}
