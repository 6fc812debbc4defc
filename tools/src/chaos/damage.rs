//! `--damage`: damage to the log between kill cycles
//! (docs/reliability/chaos.md, "Damage mode").
//!
//! With the server down, the nemesis sometimes deletes, zeroes or
//! truncates a log segment (`wal/*.wal`), chosen by the seed, after taking
//! a copy of what it changes. The next start must either refuse (exit 1,
//! its "cannot start" line naming a damaged file; the copies are then put
//! back and the run goes on) or start with nothing acknowledged missing
//! (the checker's invariants over the whole history judge that).
//!
//! Only damage that the start rule of `wal::check_continuity` is sure to
//! see is applied to segments that may hold acknowledged records: the
//! segment `CHECKPOINT`'s `log` line names, segments its `sizes` line
//! lists, and segments between two others from that one on. Damage to
//! records written since the last checkpoint into the last segment,
//! leaving nothing intact after them, cannot be told from a torn write
//! (the documented limit), so it is never applied: it would lose
//! acknowledged messages by design. One kind (`zero-tail`) changes only
//! what the rule lets go unnoticed, the bytes after the last intact record
//! of the log, and must therefore cost nothing.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Every damage kind, in the order of the summary.
pub const KINDS: [&str; 6] = [
    "delete-log",
    "delete-between",
    "delete-all",
    "zero",
    "truncate",
    "zero-tail",
];

/// The kinds `--min-hits` requires. `zero-tail` needs bytes after the
/// log's end that are not zeros already (a reused segment's leftovers),
/// which a run may never have: it is reported, not required.
pub const REQUIRED: [&str; 5] = [
    "delete-log",
    "delete-between",
    "delete-all",
    "zero",
    "truncate",
];

/// Frame header of a log record: length (4), CRC-32 of the rest of the
/// frame (4), lsn (8), first lsn of its batch (8).
const HEADER: usize = 24;

/// What `CHECKPOINT` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The applied lsn N.
    pub applied: u64,
    /// (segment S, lsn F of its first record), if recorded.
    pub log: Option<(u64, u64)>,
    /// (segment, bytes) from S on, as recorded.
    pub sizes: Vec<(u64, u64)>,
}

/// Parses the text of `CHECKPOINT`; `None` if it is not one.
pub fn parse_checkpoint(text: &str) -> Option<Checkpoint> {
    let mut lines = text.lines();
    if lines.next()? != "letterbox checkpoint" {
        return None;
    }
    let applied = lines
        .next()?
        .strip_prefix("applied ")?
        .trim()
        .parse()
        .ok()?;
    let mut cp = Checkpoint {
        applied,
        log: None,
        sizes: Vec::new(),
    };
    for line in lines {
        if let Some(rest) = line.strip_prefix("log ") {
            let mut it = rest.split_whitespace().map(str::parse::<u64>);
            cp.log = Some((it.next()?.ok()?, it.next()?.ok()?));
        } else if let Some(rest) = line.strip_prefix("sizes ") {
            for pair in rest.split_whitespace() {
                let (n, b) = pair.split_once(':')?;
                cp.sizes.push((n.parse().ok()?, b.parse().ok()?));
            }
        }
    }
    Some(cp)
}

/// The path of log segment `number` in `wal`.
pub fn segment_path(wal: &Path, number: u64) -> PathBuf {
    wal.join(format!("{number:020}.wal"))
}

/// Numbers of the segments in `wal`, ascending.
pub fn list_segments(wal: &Path) -> Vec<u64> {
    let mut out: Vec<u64> = std::fs::read_dir(wal)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".wal")?
                .parse::<u64>()
                .ok()
        })
        .collect();
    out.sort_unstable();
    out
}

/// What is done to one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Removed.
    Delete,
    /// Zeros from this offset to the end (the size kept).
    ZeroFrom(u64),
    /// Cut to this length.
    Truncate(u64),
}

/// One planned damage.
#[derive(Debug, Clone)]
pub struct Damage {
    /// One of [`KINDS`].
    pub kind: &'static str,
    /// The segments changed and how.
    pub files: Vec<(PathBuf, Action)>,
    /// True when the start rule must refuse it (false: it changes only
    /// what the rule may let go unnoticed, and must cost nothing).
    pub must_refuse: bool,
}

impl Damage {
    /// One line for the history and the log.
    pub fn describe(&self) -> String {
        let files: Vec<String> = self
            .files
            .iter()
            .map(|(p, a)| {
                let name = p.file_name().map_or("?".into(), |n| n.to_string_lossy());
                match a {
                    Action::Delete => format!("{name} deleted"),
                    Action::ZeroFrom(0) => format!("{name} zeroed"),
                    Action::ZeroFrom(at) => format!("{name} zeroed from byte {at}"),
                    Action::Truncate(to) => format!("{name} truncated to {to} bytes"),
                }
            })
            .collect();
        format!("{}: {}", self.kind, files.join(", "))
    }
}

/// Plans damage of `kind` to the log in `data` (the server down), or
/// `None` when this kind cannot be applied soundly to the directory as it
/// is (no checkpoint with a `log` line yet, no segment between two others,
/// the first record of the checkpoint's segment not durable at the
/// checkpoint, nothing after the last record...).
pub fn plan(kind: &str, data: &Path, rng: &mut fastrand::Rng) -> Option<Damage> {
    let kind = KINDS.iter().copied().find(|k| *k == kind)?;
    let cp = parse_checkpoint(&std::fs::read_to_string(data.join("CHECKPOINT")).ok()?)?;
    let (s, first) = cp.log?;
    let wal = data.join("wal");
    let present = list_segments(&wal);
    if !present.contains(&s) {
        // The start refuses this directory already; nothing to add.
        return None;
    }
    let seg = |n: u64| segment_path(&wal, n);
    let len = |n: u64| std::fs::metadata(seg(n)).map_or(0, |m| m.len());
    let one = |n: u64, a: Action| Damage {
        kind,
        files: vec![(seg(n), a)],
        must_refuse: true,
    };
    match kind {
        // Refused: the checkpoint says the log goes on in it.
        "delete-log" => Some(one(s, Action::Delete)),
        // Refused: from S on the segments must be consecutive (or, when
        // `sizes` lists it, it must exist).
        "delete-between" => {
            let last = *present.last()?;
            let between: Vec<u64> = present
                .iter()
                .copied()
                .filter(|&n| n > s && n < last)
                .collect();
            (!between.is_empty()).then(|| one(between[rng.usize(..between.len())], Action::Delete))
        }
        // Refused: S is missing.
        "delete-all" => Some(Damage {
            kind,
            files: present.iter().map(|&n| (seg(n), Action::Delete)).collect(),
            must_refuse: true,
        }),
        // Refused only when S's first record was durable at the checkpoint
        // (F <= N), or when the next segment's first record comes after it
        // (the log filled S): then it must still be S's first intact
        // frame. Otherwise S may be the last segment holding records, all
        // written since the checkpoint: the limit, not applied.
        "zero" => {
            let moved_on = first_lsn(&seg(s + 1)).is_some_and(|l| l > first);
            ((first <= cp.applied || moved_on) && len(s) > 0).then(|| one(s, Action::ZeroFrom(0)))
        }
        // Refused: shorter than the size `sizes` recorded.
        "truncate" => {
            let listed: Vec<(u64, u64)> = cp
                .sizes
                .iter()
                .copied()
                .filter(|&(n, size)| size >= 2 && len(n) >= size)
                .collect();
            if listed.is_empty() {
                return None;
            }
            let (n, size) = listed[rng.usize(..listed.len())];
            Some(one(n, Action::Truncate(size / 2)))
        }
        // Allowed to go unnoticed, and harmless: bytes after the last
        // intact record of the log, that are not all zero (a reused
        // segment's older records, a torn write): in the segment whose
        // first record is the newest, after its records, or a whole later
        // segment (its records, if any, are older: left from its earlier
        // life).
        "zero-tail" => {
            let (newest_first, newest) = present
                .iter()
                .copied()
                .filter(|&n| n >= s)
                .filter_map(|n| Some((first_lsn(&seg(n))?, n)))
                .max()?;
            let mut candidates = Vec::new();
            for n in present.iter().copied().filter(|&n| n >= newest) {
                let Ok(data) = std::fs::read(seg(n)) else {
                    continue;
                };
                let from = if n == newest {
                    frames_end(&data)
                } else if frame_at(&data, 0).is_none_or(|(l, _)| l < newest_first) {
                    0
                } else {
                    // Cannot be: its first record would be the newest.
                    continue;
                };
                if data[from..].iter().any(|&b| b != 0) {
                    candidates.push((seg(n), Action::ZeroFrom(from as u64)));
                }
            }
            (!candidates.is_empty()).then(|| Damage {
                kind,
                files: vec![candidates.swap_remove(rng.usize(..candidates.len()))],
                must_refuse: false,
            })
        }
        _ => None,
    }
}

/// The lsn of the first intact frame of the segment at `path`.
fn first_lsn(path: &Path) -> Option<u64> {
    let data = std::fs::read(path).ok()?;
    frame_at(&data, 0).map(|(lsn, _)| lsn)
}

/// (lsn, length) of the intact frame at `pos`.
fn frame_at(data: &[u8], pos: usize) -> Option<(u64, usize)> {
    let header = data.get(pos..pos.checked_add(HEADER)?)?;
    let len = u32::from_le_bytes(header[0..4].try_into().ok()?) as usize;
    if len == 0 {
        return None;
    }
    let crc = u32::from_le_bytes(header[4..8].try_into().ok()?);
    let end = pos.checked_add(HEADER)?.checked_add(len)?;
    if crc32fast::hash(data.get(pos + 8..end)?) != crc {
        return None;
    }
    Some((
        u64::from_le_bytes(header[8..16].try_into().ok()?),
        HEADER + len,
    ))
}

/// The end of the segment's records: its intact frames from the start, as
/// long as their lsns go up (a reused segment's older records follow).
pub fn frames_end(data: &[u8]) -> usize {
    let mut pos = 0;
    let mut last: Option<u64> = None;
    while let Some((lsn, len)) = frame_at(data, pos) {
        if last.is_some_and(|l| lsn <= l) {
            break;
        }
        last = Some(lsn);
        pos += len;
    }
    pos
}

/// Copies what `d` changes into `backup`, then applies it.
pub fn apply(d: &Damage, backup: &Path) -> Result<()> {
    let _ = std::fs::remove_dir_all(backup);
    std::fs::create_dir_all(backup)?;
    for (path, _) in &d.files {
        let name = path.file_name().context("segment name")?;
        std::fs::copy(path, backup.join(name))
            .with_context(|| format!("copying {}", path.display()))?;
    }
    for (path, action) in &d.files {
        match action {
            Action::Delete => std::fs::remove_file(path)
                .with_context(|| format!("deleting {}", path.display()))?,
            Action::ZeroFrom(at) => {
                use std::os::unix::fs::FileExt;
                let f = std::fs::OpenOptions::new().write(true).open(path)?;
                let size = f.metadata()?.len();
                let zeros = vec![0u8; (size.saturating_sub(*at)) as usize];
                f.write_all_at(&zeros, *at)
                    .with_context(|| format!("zeroing {}", path.display()))?;
                f.sync_all()?;
            }
            Action::Truncate(to) => {
                let f = std::fs::OpenOptions::new().write(true).open(path)?;
                f.set_len(*to)
                    .with_context(|| format!("truncating {}", path.display()))?;
                f.sync_all()?;
            }
        }
    }
    Ok(())
}

/// Puts back what [`apply`] copied.
pub fn restore(d: &Damage, backup: &Path) -> Result<()> {
    for (path, _) in &d.files {
        let name = path.file_name().context("segment name")?;
        let _ = std::fs::remove_file(path);
        std::fs::copy(backup.join(name), path)
            .with_context(|| format!("restoring {}", path.display()))?;
        std::fs::File::open(path)?.sync_all()?;
    }
    if let Some((first, _)) = d.files.first()
        && let Some(dir) = first.parent()
    {
        std::fs::File::open(dir)?.sync_all()?;
    }
    let _ = std::fs::remove_dir_all(backup);
    Ok(())
}

/// The server's "cannot start" line in `log` that names one of the
/// damaged files (its path or its file name), if any.
pub fn refusal_line<'a>(log: &'a str, d: &Damage) -> Option<&'a str> {
    log.lines().find(|l| {
        l.contains("cannot start")
            && d.files.iter().any(|(p, _)| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| l.contains(n))
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_checkpoint_with_and_without_its_log_lines() {
        let cp =
            parse_checkpoint("letterbox checkpoint\napplied 42\nlog 3 40\nsizes 3:1024 4:2048\n")
                .unwrap();
        assert_eq!(cp.applied, 42);
        assert_eq!(cp.log, Some((3, 40)));
        assert_eq!(cp.sizes, vec![(3, 1024), (4, 2048)]);
        let old = parse_checkpoint("letterbox checkpoint\napplied 7\n").unwrap();
        assert_eq!(old.log, None);
        assert!(old.sizes.is_empty());
        assert!(parse_checkpoint("something else\n").is_none());
    }

    fn frame(lsn: u64, body: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; HEADER];
        f.extend_from_slice(body);
        let len = (f.len() - HEADER) as u32;
        f[0..4].copy_from_slice(&len.to_le_bytes());
        f[8..16].copy_from_slice(&lsn.to_le_bytes());
        f[16..24].copy_from_slice(&lsn.to_le_bytes());
        let crc = crc32fast::hash(&f[8..]);
        f[4..8].copy_from_slice(&crc.to_le_bytes());
        f
    }

    #[test]
    fn the_end_of_the_records_stops_at_zeros_damage_or_an_older_record() {
        let mut seg = frame(5, b"abc");
        seg.extend(frame(6, b"de"));
        let end = seg.len();
        seg.extend(frame(2, b"old"));
        seg.extend([0u8; 16]);
        assert_eq!(frames_end(&seg), end);
        seg[end + 30] ^= 1;
        assert_eq!(frames_end(&seg), end);
        assert_eq!(frames_end(&[0u8; 64]), 0);
    }

    fn dir_with(cp: &str, segments: &[(u64, Vec<u8>)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("CHECKPOINT"), cp).unwrap();
        std::fs::create_dir(d.path().join("wal")).unwrap();
        for (n, bytes) in segments {
            std::fs::write(segment_path(&d.path().join("wal"), *n), bytes).unwrap();
        }
        d
    }

    #[test]
    fn only_damage_the_rule_must_refuse_is_planned_on_records() {
        let mut s3 = frame(40, b"x");
        s3.extend(frame(41, b"y"));
        s3.resize(256, 0);
        let mut s4 = frame(42, b"z");
        s4.resize(256, 0);
        let s5 = vec![0u8; 256];
        let d = dir_with(
            "letterbox checkpoint\napplied 40\nlog 3 40\nsizes 3:256 4:256\n",
            &[(2, vec![1; 256]), (3, s3), (4, s4), (5, s5)],
        );
        let mut rng = fastrand::Rng::with_seed(1);
        let p = |k: &str, rng: &mut fastrand::Rng| plan(k, d.path(), rng).unwrap();
        let name = |d: &Damage| d.files[0].0.file_name().unwrap().to_owned();
        assert_eq!(name(&p("delete-log", &mut rng)), "00000000000000000003.wal");
        assert_eq!(
            name(&p("delete-between", &mut rng)),
            "00000000000000000004.wal"
        );
        assert_eq!(p("delete-all", &mut rng).files.len(), 4);
        assert_eq!(p("zero", &mut rng).files[0].1, Action::ZeroFrom(0));
        assert_eq!(p("truncate", &mut rng).files[0].1, Action::Truncate(128));
        // Nothing after the newest record: no tail to zero.
        assert!(plan("zero-tail", d.path(), &mut rng).is_none());
    }

    #[test]
    fn the_checkpoint_segment_is_not_zeroed_when_its_first_record_came_after_it() {
        let mut s3 = frame(41, b"x");
        let end = s3.len() as u64;
        s3.extend(frame(7, b"old record of a reused segment"));
        s3.resize(256, 0);
        let d = dir_with(
            "letterbox checkpoint\napplied 40\nlog 3 41\nsizes 3:256\n",
            &[(3, s3)],
        );
        let mut rng = fastrand::Rng::with_seed(1);
        assert!(plan("zero", d.path(), &mut rng).is_none());
        assert!(plan("delete-between", d.path(), &mut rng).is_none());
        let tail = plan("zero-tail", d.path(), &mut rng).unwrap();
        assert!(!tail.must_refuse);
        assert_eq!(tail.files[0].1, Action::ZeroFrom(end));
        let backup = d.path().join("backup");
        let before = std::fs::read(&tail.files[0].0).unwrap();
        apply(&tail, &backup).unwrap();
        let after = std::fs::read(&tail.files[0].0).unwrap();
        assert_eq!(after.len(), before.len());
        assert!(after[end as usize..].iter().all(|&b| b == 0));
        restore(&tail, &backup).unwrap();
        assert_eq!(std::fs::read(&tail.files[0].0).unwrap(), before);
    }

    #[test]
    fn the_checkpoint_segment_is_zeroed_when_the_log_moved_on_and_stale_segments_are_a_tail() {
        let mut s3 = frame(41, b"x");
        s3.resize(256, 0);
        let mut s4 = frame(42, b"y");
        s4.resize(256, 0);
        let mut s5 = frame(9, b"stale");
        s5.resize(256, 0);
        let d = dir_with(
            "letterbox checkpoint\napplied 40\nlog 3 41\nsizes 3:256\n",
            &[(3, s3), (4, s4), (5, s5)],
        );
        let mut rng = fastrand::Rng::with_seed(1);
        let zero = plan("zero", d.path(), &mut rng).unwrap();
        assert_eq!(zero.files[0].1, Action::ZeroFrom(0));
        let tail = plan("zero-tail", d.path(), &mut rng).unwrap();
        assert_eq!(
            tail.files[0],
            (segment_path(&d.path().join("wal"), 5), Action::ZeroFrom(0))
        );
    }

    #[test]
    fn a_refusal_must_name_a_damaged_file() {
        let d = Damage {
            kind: "delete-log",
            files: vec![(
                PathBuf::from("/x/wal/00000000000000000003.wal"),
                Action::Delete,
            )],
            must_refuse: true,
        };
        let log = "ERROR letterbox: cannot start error=corrupt data in /x/wal/00000000000000000003.wal: missing\n";
        assert!(refusal_line(log, &d).is_some());
        let other = "ERROR letterbox: cannot start error=corrupt data in /x/db: damaged\n";
        assert!(refusal_line(other, &d).is_none());
    }
}
