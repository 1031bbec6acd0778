//! Small file-system helpers: atomic writes with explicit permissions and
//! reads that report the path on failure.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::CertError;

/// Permission bits for private keys and kubeconfig files.
pub(crate) const MODE_PRIVATE: u32 = 0o600;
/// Permission bits for certificates.
pub(crate) const MODE_PUBLIC: u32 = 0o644;

/// Creates `dir` and its parents. Newly created directories get mode 0700 on
/// unix; existing ones are left alone.
pub(crate) fn create_dir_all(dir: &Path) -> Result<(), CertError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder
        .create(dir)
        .map_err(|e| CertError::io("create directory", dir, e))
}

/// Reads `path` as UTF-8. `Ok(None)` means the file does not exist.
pub(crate) fn read_optional(path: &Path) -> Result<Option<String>, CertError> {
    match fs::read(path) {
        Ok(bytes) => String::from_utf8(bytes).map(Some).map_err(|_| {
            CertError::io(
                "read",
                path,
                io::Error::new(io::ErrorKind::InvalidData, "file is not valid UTF-8 text"),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(CertError::io("read", path, e)),
    }
}

/// Reads `path` as UTF-8; a missing file is an error.
pub(crate) fn read_required(path: &Path) -> Result<String, CertError> {
    read_optional(path)?.ok_or_else(|| {
        CertError::io(
            "read",
            path,
            io::Error::new(io::ErrorKind::NotFound, "file not found"),
        )
    })
}

/// Writes `contents` to `path` atomically: the data goes to a fresh temporary
/// file in the same directory (created with `mode` on unix), is flushed to
/// disk, and is then renamed over `path`. Readers see either the old or the
/// new file, never a partial one.
pub(crate) fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), CertError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path.file_name().ok_or_else(|| {
        CertError::io(
            "write",
            path,
            io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"),
        )
    })?;

    let (tmp_path, mut file) = create_temp(&dir, &file_name.to_string_lossy(), mode)?;
    let result = (|| {
        file.write_all(contents)
            .map_err(|e| CertError::io("write", &tmp_path, e))?;
        file.sync_all()
            .map_err(|e| CertError::io("sync", &tmp_path, e))?;
        drop(file);
        fs::rename(&tmp_path, path).map_err(|e| CertError::io("rename into place", path, e))
    })();
    if result.is_err() {
        // Best effort: do not leave temporary files behind.
        let _ = fs::remove_file(&tmp_path);
        return result;
    }
    sync_dir(&dir);
    Ok(())
}

/// Creates a new, uniquely named temporary file in `dir`.
fn create_temp(dir: &Path, base: &str, mode: u32) -> Result<(PathBuf, File), CertError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut last_err = None;
    for _ in 0..16 {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{base}.tmp-{}-{n}-{nanos}", std::process::id()));
        let mut opts = OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(mode);
        }
        #[cfg(not(unix))]
        let _ = mode;
        match opts.open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_err = Some((tmp, e)),
            Err(e) => return Err(CertError::io("create", tmp, e)),
        }
    }
    let (tmp, e) = last_err.unwrap_or_else(|| {
        (
            dir.to_path_buf(),
            io::Error::other("could not pick a temporary file name"),
        )
    });
    Err(CertError::io("create", tmp, e))
}

/// Flushes the directory entry so that a completed rename survives a crash.
/// Failures are ignored: not every platform or file system supports it.
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}
