//! The runtime knows no particular control plane: what is particular to kcp (its cluster
//! annotation, its paths, its virtual workspaces) belongs in a provider outside this crate. A word
//! of kcp in the runtime's sources fails here.

use std::path::Path;

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("reading the sources") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_runtime_names_no_control_plane() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() > 10, "the runtime's sources were not found");
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("reading a source file");
        for (n, line) in text.lines().enumerate() {
            if line.to_ascii_lowercase().contains("kcp") {
                found.push(format!("{}:{}: {line}", file.display(), n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "kcp named in the runtime:\n{}",
        found.join("\n")
    );
}
