//! The LD_PRELOAD library (`tools/shim/lbshim.c`, compiled with the
//! system C compiler at run time), its kill points and call counters, and
//! the rebuilding of a data directory from its durable mirror after a
//! simulated power cut.

use std::collections::{BTreeMap, HashMap};
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
    Ok(rebuild(mirror, out)?.len())
}

/// Rebuilds the tree; returns each rebuilt file's inode key and path.
fn rebuild(mirror: &Path, out: &Path) -> Result<HashMap<String, PathBuf>> {
    let root = std::fs::read_to_string(mirror.join("root"))
        .with_context(|| format!("reading {}", mirror.join("root").display()))?;
    let parts: Vec<&str> = root.split_whitespace().collect();
    if parts.len() != 3 || parts.iter().any(|p| p.parse::<u64>().is_err()) {
        // Rebuilding from it would lose the whole tree: a fault of the
        // harness, not of the server.
        bail!(
            "malformed mirror root record {root:?} in {}",
            mirror.display()
        );
    }
    let key = parts.join(".");
    if out.exists() {
        std::fs::remove_dir_all(out).with_context(|| format!("removing {}", out.display()))?;
    }
    let mut files = HashMap::new();
    build_dir(mirror, &key, out, &mut files, 0)?;
    Ok(files)
}

/// Torn mode: rebuilds the tree, then lets each page written but not
/// synced reach it with probability one half, taking the page's content
/// from the real file (what the process last wrote there, since its page
/// cache survived the kill): the disk wrote some of its cache back, in any
/// order, before the power went. `real` is the tree the process used.
/// Returns (files, pages let through).
pub fn materialize_torn(
    mirror: &Path,
    out: &Path,
    real: &Path,
    rng: &mut fastrand::Rng,
) -> Result<(usize, u64)> {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let files = rebuild(mirror, out)?;
    let journal = std::fs::read_to_string(mirror.join("writes.log")).unwrap_or_default();
    // Unsynced ranges per inode key: writes since its last sync.
    let mut dirty: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for line in journal.lines() {
        let mut p = line.split(' ');
        match (p.next(), p.next(), p.next(), p.next()) {
            (Some("W"), Some(key), Some(s), Some(e)) => {
                if let (Ok(s), Ok(e)) = (s.parse::<u64>(), e.parse::<u64>()) {
                    dirty.entry(key).or_default().push((s, e));
                }
            }
            (Some("S"), Some(key), _, _) => {
                dirty.remove(key);
            }
            _ => {} // a line cut short by the kill
        }
    }
    // The real files by inode (device.inode).
    let mut real_files: HashMap<String, PathBuf> = HashMap::new();
    let mut stack = vec![real.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                real_files.insert(format!("{}.{}", m.dev(), m.ino()), e.path());
            }
        }
    }
    const PAGE: u64 = 4096;
    let mut pages = 0u64;
    let mut keys: Vec<&str> = dirty.keys().copied().collect();
    keys.sort_unstable();
    for key in keys {
        let Some(target) = files.get(key) else {
            continue; // its entry did not survive
        };
        let ino = key.rsplit_once('.').map_or(key, |(di, _)| di);
        let Some(src_path) = real_files.get(ino) else {
            continue; // deleted since
        };
        let src = std::fs::File::open(src_path)
            .with_context(|| format!("opening {}", src_path.display()))?;
        let size = src.metadata()?.len();
        let dst = std::fs::OpenOptions::new()
            .write(true)
            .open(target)
            .with_context(|| format!("opening {}", target.display()))?;
        let mut page_set: Vec<u64> = dirty[key]
            .iter()
            .flat_map(|(s, e)| (s / PAGE)..e.div_ceil(PAGE))
            .collect();
        page_set.sort_unstable();
        page_set.dedup();
        let mut buf = vec![0u8; PAGE as usize];
        for page in page_set {
            let off = page * PAGE;
            if off >= size || !rng.bool() {
                continue;
            }
            let n = usize::try_from(PAGE.min(size - off)).unwrap_or(0);
            src.read_exact_at(&mut buf[..n], off)?;
            dst.write_all_at(&buf[..n], off)?;
            pages += 1;
        }
    }
    Ok((files.len(), pages))
}

fn build_dir(
    mirror: &Path,
    key: &str,
    path: &Path,
    files: &mut HashMap<String, PathBuf>,
    depth: usize,
) -> Result<()> {
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
                files.insert(child_key, child);
            }
            other => bail!("unknown entry kind {other:?} in {}", listing.display()),
        }
    }
    Ok(())
}
