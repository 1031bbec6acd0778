//! The layer rule of the apiserver crate: every top-level module belongs to one layer, and a
//! module imports (`crate::x`) only modules of its own layer or of layers below it, so the
//! request path runs in one direction:
//!
//! meta ← request ← storage ← registry ← admission ← tenancy, authn, authz ← endpoints ← server
//!
//! The imports are read from the source text. The imports that still run upward are listed,
//! with the reason, in `tests/layers-known-violations.txt`; a new upward import fails this
//! test, and so does a listed one that is gone (the list only shrinks).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Layers from the bottom up, with their modules.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "meta",
        &[
            "status",
            "field_error",
            "names",
            "selectors",
            "jsonpath",
            "table",
            "protobuf",
            "strategic_merge",
            "apply",
            "schema",
            "body",
            "metrics",
            "heavy",
            "client",
            "response",
            "audit",
        ],
    ),
    (
        "request",
        &["request_info", "query", "negotiation", "identity"],
    ),
    ("storage", &["storage"]),
    (
        "registry",
        &[
            "registry",
            "kcp_types",
            "catalog",
            "discovery",
            "openapi",
            "objects",
        ],
    ),
    ("admission", &["admission", "rules", "limits", "namespaces"]),
    (
        "tenancy, authn, authz",
        &[
            "tenancy",
            "authn",
            "serviceaccounts",
            "auth",
            "authz",
            "budget",
            "workspace_authn",
        ],
    ),
    (
        "endpoints",
        &[
            "handlers",
            "dispatch",
            "webhook",
            "reviews",
            "views",
            "lifecycle_vw",
        ],
    ),
    ("server", &["server"]),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
}

/// The top-level module a source file belongs to (`handlers/create.rs` → `handlers`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    Some(first.trim_end_matches(".rs").to_string())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules a source text names after `crate::`, also inside `crate::{a, b::c}`.
fn imported_modules(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group: split at commas outside nested braces.
            let mut depth = 0usize;
            let mut start = 0usize;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.insert(ident(group[start..j].trim()));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(ident(group[start..j].trim()));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out.retain(|m| !m.is_empty());
    out
}

#[test]
fn imports_run_down_the_layers_only() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    // module → modules it imports from higher layers
    let mut upward: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut unplaced = BTreeSet::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        if module == "lib" {
            continue;
        }
        let Some(own) = layer_of(&module) else {
            unplaced.insert(module);
            continue;
        };
        let text = std::fs::read_to_string(file).expect("read source");
        for imported in imported_modules(&text) {
            match layer_of(&imported) {
                Some(l) if l > own => {
                    upward.entry(module.clone()).or_default().insert(imported);
                }
                Some(_) => {}
                None => {
                    unplaced.insert(imported);
                }
            }
        }
    }
    assert!(
        unplaced.is_empty(),
        "modules without a layer (add them to LAYERS): {unplaced:?}"
    );
    let found: BTreeSet<String> = upward
        .iter()
        .flat_map(|(from, tos)| tos.iter().map(move |to| format!("{from} -> {to}")))
        .collect();
    let listed_text = std::fs::read_to_string(root.join("tests/layers-known-violations.txt"))
        .expect("tests/layers-known-violations.txt");
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
        "imports that run up the layers (import from below, or move the module): {new:?}"
    );
    assert!(
        gone.is_empty(),
        "listed upward imports that are gone: remove them from tests/layers-known-violations.txt: {gone:?}"
    );
}

#[test]
fn the_import_reader_sees_grouped_and_nested_imports() {
    let text = "use crate::{discovery, namespaces};\nuse crate::status::{ApiError, Cause};\nlet x = crate::objects::name(&v);\nuse crate::{a::{b, c}, d};";
    let got: Vec<String> = imported_modules(text).into_iter().collect();
    assert_eq!(
        got,
        ["a", "d", "discovery", "namespaces", "objects", "status"]
    );
}
