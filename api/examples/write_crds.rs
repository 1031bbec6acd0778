//! Writes the generated CRD manifests to `manifests/crds/` (or the directory given as argument).
//! Same as `platform-mesh crds`; handy while working on the `api` crate alone.

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../manifests/crds"))
        });
    for path in api::write_crds(&dir)? {
        println!("wrote {}", path.display());
    }
    Ok(())
}
