//! The shape of the code, read from the source text of every crate of the workspace:
//!
//! - the apiserver crate's top-level folders are its layers, and a module imports (`crate::…`)
//!   only from its own layer or from the layers below it;
//! - no two modules of a crate import each other, directly or around a circle (for the
//!   apiserver crate, a module is one that a layer declares `pub mod`; elsewhere a top-level
//!   module).
//!
//! - the reconcilers of the controllers crate are siblings: none imports another; what they
//!   share lives in modules of its own (`kcp`, `objects`, `kubeconfigs`, `subroutines`, ...);
//! - unit tests have one naming scheme: the tests of module `m` are `m/tests.rs` (a submodule
//!   `tests`), or `m/tests/<topic>.rs` when there are several; no `tests_<topic>.rs` or
//!   `<module>_tests.rs` beside them and no `#[path]` to reach one. Whole-binary tests are
//!   `tests/<suite>.rs`, end-to-end suites one binary per crate.
//!
//! - objects are written through the generic store: the writes to the raw store outside
//!   `storage/` and `registry/generic/` are listed, with the reason, in
//!   `tests/raw-store-writes.txt`, and the list only shrinks.
//!
//! The circles that remain are listed, with the reason, in `tests/module-circles.txt`; a new
//! circle fails, and so does a listed one that is gone (the list only shrinks). Imports through
//! `super::` stay inside a module and are not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The apiserver crate's layers, from the bottom up: one folder each under `apiserver/src`.
const LAYERS: &[&str] = &[
    "meta",
    "request",
    "storage",
    "registry",
    "admission",
    "access",
    "endpoints",
    "server",
];

/// The workspace's crates: a name and the folder of its sources.
const CRATES: &[(&str, &str)] = &[
    ("api", "api/src"),
    ("apiserver", "apiserver/src"),
    ("certs", "certs/src"),
    ("controllers", "controllers/src"),
    ("gotemplate", "gotemplate/src"),
    ("https-client", "https-client/src"),
    ("mc-runtime", "mc-runtime/src"),
    ("platform-mesh", "src"),
    ("kubectl-ws", "src/bin/kubectl-ws"),
    ("mongodb-provider", "examples/mongodb-provider/provider/src"),
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            // src/bin holds crates of their own
            if !path.ends_with("src/bin") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The paths a source text names after `crate::`, cut to their first two names, also inside
/// groups: `crate::{a::{b, c}, d}` names `a::b`, `a::c` and `d`.
fn crate_paths(text: &str) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        if text[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let mut chars = text[i + "crate::".len()..].chars().peekable();
        use_tree(&mut chars, Vec::new(), &mut out);
    }
    out
}

/// Reads one use tree (`a::b::{c, d}`, `{…}`, `a::*`, `a as b` or a name), adding its paths,
/// cut to their first two names, to `out`.
fn use_tree(
    chars: &mut std::iter::Peekable<std::str::Chars>,
    prefix: Vec<String>,
    out: &mut BTreeSet<Vec<String>>,
) {
    let skip_space = |chars: &mut std::iter::Peekable<std::str::Chars>| {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
    };
    let mut insert = |mut path: Vec<String>| {
        path.truncate(2);
        if !path.is_empty() {
            out.insert(path);
        }
    };
    skip_space(chars);
    match chars.peek() {
        Some('{') => {
            chars.next();
            loop {
                skip_space(chars);
                if chars.peek() == Some(&'}') {
                    chars.next();
                    return;
                }
                use_tree(chars, prefix.clone(), out);
                skip_space(chars);
                if chars.next() != Some(',') {
                    return;
                }
            }
        }
        Some('*') => {
            chars.next();
            insert(prefix);
            return;
        }
        _ => {}
    }
    let mut name = String::new();
    while let Some(&c) = chars.peek() {
        if c.is_ascii_alphanumeric() || c == '_' {
            name.push(c);
            chars.next();
        } else {
            break;
        }
    }
    if name.is_empty() || name == "self" {
        insert(prefix);
        return;
    }
    let mut path = prefix;
    path.push(name);
    let mut ahead = chars.clone();
    if ahead.next() == Some(':') && ahead.next() == Some(':') {
        chars.next();
        chars.next();
        use_tree(chars, path, out);
        return;
    }
    // `a::b as c`: the new name is no path
    let mut ahead = chars.clone();
    while ahead.peek().is_some_and(|c| c.is_whitespace()) {
        ahead.next();
    }
    if ahead.next() == Some('a') && ahead.next() == Some('s') && ahead.peek() == Some(&' ') {
        *chars = ahead;
        skip_space(chars);
        while chars
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_')
        {
            chars.next();
        }
    }
    insert(path);
}

/// The modules a folder's `mod.rs` declares `pub mod`.
fn pub_mods(dir: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(dir.join("mod.rs")).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';').trim().to_string())
        .collect()
}

/// One crate's modules, each with the modules it imports (itself left out), by the rule of the
/// file's header.
fn imports(name: &str, src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let nested = name == "apiserver";
    let mut layer_mods: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut unit_of_path = |path: &[String]| -> Option<String> {
        let top = path.first()?.clone();
        if !nested {
            return Some(top);
        }
        let mods = layer_mods
            .entry(top.clone())
            .or_insert_with(|| pub_mods(&src.join(&top)));
        match path.get(1) {
            Some(second) if mods.contains(second) => Some(format!("{top}::{second}")),
            _ => Some(top),
        }
    };
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let rel: Vec<String> = file
            .strip_prefix(src)
            .expect("under src")
            .components()
            .map(|c| {
                c.as_os_str()
                    .to_str()
                    .expect("UTF-8 path")
                    .trim_end_matches(".rs")
                    .to_string()
            })
            .collect();
        if rel.len() == 1 && (rel[0] == "lib" || rel[0] == "main") {
            continue;
        }
        let Some(unit) = unit_of_path(&rel) else {
            continue;
        };
        let text = std::fs::read_to_string(file).expect("read source");
        let entry = edges.entry(unit.clone()).or_default();
        for path in crate_paths(&text) {
            if let Some(to) = unit_of_path(&path) {
                if to != unit {
                    entry.insert(to);
                }
            }
        }
    }
    // names that are no module of the crate (items of lib.rs or main.rs) are not edges
    let modules: BTreeSet<String> = edges.keys().cloned().collect();
    for tos in edges.values_mut() {
        tos.retain(|t| modules.contains(t));
    }
    edges
}

/// The strongly connected groups of more than one module (Tarjan's algorithm).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.edges.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut group = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                group.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                s.out.push(group);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn the_apiserver_folders_are_its_layers_and_imports_run_down_them() {
    let src = root().join("apiserver/src");
    let mut top = BTreeSet::new();
    for entry in std::fs::read_dir(&src).expect("read_dir").flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name != "lib.rs" {
            top.insert(name);
        }
    }
    let layers: BTreeSet<String> = LAYERS.iter().map(|l| l.to_string()).collect();
    assert_eq!(
        top, layers,
        "apiserver/src holds lib.rs and one folder per layer, nothing else"
    );
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let declared: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';').to_string())
        .collect();
    assert_eq!(declared, layers, "lib.rs declares the layers and only them");

    let layer_of = |module: &str| {
        let top = module.split("::").next().unwrap_or(module);
        LAYERS.iter().position(|l| *l == top).expect("a layer")
    };
    let mut upward = Vec::new();
    for (from, tos) in imports("apiserver", &src) {
        for to in tos {
            if layer_of(&to) > layer_of(&from) {
                upward.push(format!("{from} -> {to}"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that run up the layers (import from below, or move the module): {upward:?}"
    );
}

#[test]
fn no_two_modules_of_a_crate_import_each_other() {
    let mut found = BTreeSet::new();
    for (name, dir) in CRATES {
        let src = root().join(dir);
        assert!(src.is_dir(), "{dir} is no folder: update CRATES");
        for group in circles(&imports(name, &src)) {
            found.insert(format!("{name}: {}", group.join(" ")));
        }
    }
    let listed_text =
        std::fs::read_to_string(root().join("tests/module-circles.txt")).expect("the list");
    let listed: BTreeSet<String> = listed_text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    let new: Vec<_> = found.difference(&listed).collect();
    let gone: Vec<_> = listed.difference(&found).collect();
    assert!(
        new.is_empty(),
        "modules that import each other around a circle (move what both need below them): {new:?}"
    );
    assert!(
        gone.is_empty(),
        "listed circles that are gone: remove them from tests/module-circles.txt: {gone:?}"
    );
}

/// The controllers crate's reconcilers; `tenants` assembles some of them and is none.
const RECONCILERS: &[&str] = &["account", "broker", "platformmesh", "provider", "security"];

#[test]
fn the_reconcilers_import_none_of_each_other() {
    let edges = imports("controllers", &root().join("controllers/src"));
    let mut found = Vec::new();
    for from in RECONCILERS {
        for to in edges.get(*from).into_iter().flatten() {
            if RECONCILERS.contains(&to.as_str()) {
                found.push(format!("{from} -> {to}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "reconcilers that import another (move what they share into a module of its own): {found:?}"
    );
}

#[test]
fn unit_test_files_have_one_naming_scheme() {
    let mut odd = Vec::new();
    for (_, dir) in CRATES {
        let mut files = Vec::new();
        rust_files(&root().join(dir), &mut files);
        for file in files {
            let name = file
                .file_stem()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let text = std::fs::read_to_string(&file).expect("read");
            let misnamed = name.starts_with("tests_") || name.ends_with("_tests");
            let path_attribute = text.lines().any(|l| l.trim_start().starts_with("#[path"));
            if misnamed || path_attribute {
                odd.push(
                    file.strip_prefix(root())
                        .unwrap_or(&file)
                        .display()
                        .to_string(),
                );
            }
        }
    }
    assert!(
        odd.is_empty(),
        "unit tests of module m go in m/tests.rs or m/tests/<topic>.rs, without #[path]: {odd:?}"
    );
}

#[test]
fn the_import_reader_sees_grouped_and_nested_paths() {
    let text = "use crate::{discovery, namespaces};\nuse crate::status::{ApiError, Cause};\n\
                let x = crate::objects::name(&v);\nuse crate::{a::{b, c}, d};\n\
                use crate::{e::f::g as h, i::*, j::{self, k}, l};\n\
                $crate::ignored::x; other_crate::y;";
    let got: Vec<String> = crate_paths(text)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        got,
        [
            "a::b",
            "a::c",
            "d",
            "discovery",
            "e::f",
            "i",
            "j",
            "j::k",
            "l",
            "namespaces",
            "objects::name",
            "status::ApiError",
            "status::Cause"
        ]
    );
}

#[test]
fn a_circle_is_found_and_a_chain_is_not() {
    let edges = |pairs: &[(&str, &str)]| {
        let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            m.entry(a.to_string()).or_default().insert(b.to_string());
            m.entry(b.to_string()).or_default();
        }
        m
    };
    assert_eq!(
        circles(&edges(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")])),
        vec![vec!["a".to_string(), "b".to_string(), "c".to_string()]]
    );
    assert!(circles(&edges(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());
}

/// The writes to the raw store in `text` (`store.create(`, `.update(`, `.delete(`, however
/// rustfmt breaks the chain), outside its unit tests.
fn raw_store_writes(text: &str) -> usize {
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
    let squeezed: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    ["store.create(", "store.update(", "store.delete("]
        .iter()
        .map(|call| squeezed.matches(call).count())
        .sum()
}

#[test]
fn objects_are_written_through_the_generic_store() {
    let mut found = BTreeMap::new();
    let src = root().join("apiserver/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    for file in files {
        let rel = file
            .strip_prefix(root())
            .unwrap_or(&file)
            .display()
            .to_string();
        let inside = |dir: &str| rel.starts_with(&format!("apiserver/src/{dir}/"));
        let is_test = rel.ends_with("/tests.rs") || rel.contains("/tests/");
        if inside("storage") || inside("registry/generic") || is_test {
            continue;
        }
        let n = raw_store_writes(&std::fs::read_to_string(&file).expect("read"));
        if n > 0 {
            found.insert(rel, n);
        }
    }
    let listed: BTreeMap<String, usize> =
        std::fs::read_to_string(root().join("tests/raw-store-writes.txt"))
            .expect("the list")
            .lines()
            .map(|l| l.split('#').next().unwrap_or_default().trim())
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (file, n) = l.split_once(':').expect("`file: count`");
                (file.trim().to_string(), n.trim().parse().expect("a count"))
            })
            .collect();
    assert_eq!(
        found, listed,
        "writes to the raw store go through the generic store (`GenericStore::own` for the \
         server's own); the ones that may not are listed in tests/raw-store-writes.txt"
    );
}

#[test]
fn raw_store_writes_are_counted_across_broken_chains() {
    let text = "state\n    .store\n    .update(&k, 1, e)\n; self.store.create(&k, e); \
                #[cfg(test)]\nmod tests { store.delete(&k) }";
    assert_eq!(raw_store_writes(text), 2);
    assert_eq!(raw_store_writes("objects.own(M).create(place, obj)"), 0);
}
