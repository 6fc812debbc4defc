//! The LD_PRELOAD library (`tools/shim/lbshim.c`, compiled with the
//! system C compiler at run time), its kill points and call counters, and
//! the rebuilding of a data directory from its durable mirror after a
//! simulated power cut.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The library's source.
pub const SOURCE: &str = include_str!("../../shim/lbshim.c");

/// Kill point classes of the library, in the order of its counters.
pub const CLASSES: [&str; 14] = [
    "write",
    "pwrite",
    "fsync",
    "fdatasync",
    "sync_file_range",
    "rename",
    "unlink",
    "ftruncate",
    "fallocate",
    "create",
    "mkdir",
    "syncfs",
    "mmap_write",
    "copy_file_range",
];

/// Compiles the library into `dir/lbshim.so`.
pub fn build(dir: &Path) -> Result<PathBuf> {
    let src = dir.join("lbshim.c");
    let out = dir.join("lbshim.so");
    std::fs::write(&src, SOURCE).with_context(|| format!("writing {}", src.display()))?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-O2", "-Wall", "-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .args(["-ldl", "-lpthread"])
        .status()
        .with_context(|| format!("running the C compiler {cc:?} (set CC to another one)"))?;
    if !status.success() {
        bail!("compiling {} failed: {status}", src.display());
    }
    Ok(out)
}

/// Reads the call counters a run of the library left in `path`.
pub fn read_counts(path: &Path) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    let Ok(data) = std::fs::read(path) else {
        return out;
    };
    for (i, class) in CLASSES.iter().enumerate() {
        let off = 4096 + 8 * i;
        if let Some(b) = data.get(off..off + 8) {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            out.insert(*class, u64::from_ne_bytes(a));
        }
    }
    out
}

/// Rebuilds, in `out`, the tree as the mirror says a power cut leaves it.
/// Returns the number of files rebuilt.
pub fn materialize(mirror: &Path, out: &Path) -> Result<usize> {
    let root = std::fs::read_to_string(mirror.join("root"))
        .with_context(|| format!("reading {}", mirror.join("root").display()))?;
    let key = root.split_whitespace().collect::<Vec<_>>().join(".");
    if out.exists() {
        std::fs::remove_dir_all(out).with_context(|| format!("removing {}", out.display()))?;
    }
    let mut files = 0;
    build_dir(mirror, &key, out, &mut files, 0)?;
    Ok(files)
}

fn build_dir(mirror: &Path, key: &str, path: &Path, files: &mut usize, depth: usize) -> Result<()> {
    if depth > 32 {
        bail!("mirror directory nesting too deep at {}", path.display());
    }
    std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
    let listing = mirror.join("dirs").join(key);
    let Ok(text) = std::fs::read_to_string(&listing) else {
        // Created, but its entries never made durable: empty.
        return Ok(());
    };
    for line in text.lines() {
        let mut parts = line.splitn(5, ' ');
        let (Some(kind), Some(dev), Some(ino), Some(gen_), Some(name)) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            bail!("malformed line {line:?} in {}", listing.display());
        };
        let child_key = format!("{dev}.{ino}.{gen_}");
        let child = path.join(name);
        match kind {
            "D" => build_dir(mirror, &child_key, &child, files, depth + 1)?,
            "F" => {
                let src = mirror.join("files").join(&child_key);
                if src.exists() {
                    std::fs::copy(&src, &child).with_context(|| {
                        format!("copying {} to {}", src.display(), child.display())
                    })?;
                } else {
                    // Linked durably, contents never synced.
                    std::fs::File::create(&child)
                        .with_context(|| format!("creating {}", child.display()))?;
                }
                *files += 1;
            }
            other => bail!("unknown entry kind {other:?} in {}", listing.display()),
        }
    }
    Ok(())
}
