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
//! Damage the start rule is sure to see is applied with `must_refuse`:
//! a start that takes it is a failure of its own, besides whatever the
//! checker finds lost. The rule (RELIABILITY.md, "Where the log may
//! end"): every segment `CHECKPOINT` lists (its `log` line, and its
//! `sizes` line, where the log writer lists each segment, with the lsn of
//! its first record, before answering any record written into it) must be
//! there, full size, with that first record; and wherever the log's
//! records stop, no intact record of a later write (or, when they stop
//! among records the database holds, no record it lacks) may follow,
//! anywhere. Damage to the records of the newest write alone, leaving
//! nothing intact after them, cannot be told from a torn write (the
//! documented limit), so it is never applied: it would lose acknowledged
//! messages by design. One kind (`zero-tail`) changes only what the rule
//! lets go unnoticed, the bytes after the last intact record of the log,
//! and must therefore cost nothing.
//!
//! Whether a damaged stretch of records must be refused depends on how
//! far the database has applied the log (records it holds cost nothing
//! when damaged), so those kinds are planned with the database's applied
//! lsn, as `letterbox verify` reads it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Every damage kind, in the order of the summary.
pub const KINDS: [&str; 10] = [
    "delete-log",
    "delete-between",
    "delete-all",
    "zero",
    "truncate",
    "zero-page",
    "damage-frames",
    "truncate-new",
    "zero-new",
    "zero-tail",
];

/// The kinds `--min-hits` requires. `zero-tail` needs bytes after the
/// log's end that are not zeros already (a reused segment's leftovers),
/// which a run may never have: it is reported, not required.
pub const REQUIRED: [&str; 9] = [
    "delete-log",
    "delete-between",
    "delete-all",
    "zero",
    "truncate",
    "zero-page",
    "damage-frames",
    "truncate-new",
    "zero-new",
];

/// Bytes of the page `zero-page` zeroes (a disk's sector of 4 KiB).
const PAGE: u64 = 4096;

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
    /// (segment, bytes, lsn of its first record if listed) from S on, as
    /// recorded.
    pub sizes: Vec<(u64, u64, Option<u64>)>,
}

impl Checkpoint {
    /// The lsn of segment `n`'s first record, if `sizes` lists it.
    fn first_of(&self, n: u64) -> Option<u64> {
        self.sizes
            .iter()
            .find(|&&(m, _, _)| m == n)
            .and_then(|&(_, _, f)| f)
    }
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
            for entry in rest.split_whitespace() {
                let mut it = entry.split(':');
                let n = it.next()?.parse().ok()?;
                let b = it.next()?.parse().ok()?;
                let first = match it.next() {
                    Some(f) => Some(f.parse().ok()?),
                    None => None,
                };
                cp.sizes.push((n, b, first));
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Removed.
    Delete,
    /// Zeros from this offset to the end (the size kept).
    ZeroFrom(u64),
    /// Cut to this length.
    Truncate(u64),
    /// Zeros over `[from, from + len)`.
    ZeroRange(u64, u64),
    /// One bit flipped in each byte at these offsets.
    Flip(Vec<u64>),
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
                    Action::ZeroRange(at, len) => {
                        format!("{name} zeroed over bytes {at}..{}", at + len)
                    }
                    Action::Flip(at) => {
                        let at: Vec<String> = at.iter().map(u64::to_string).collect();
                        format!("{name} damaged at bytes {}", at.join(", "))
                    }
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
/// checkpoint, nothing after the last record...). `applied` is the lsn the
/// database has applied the log to (`letterbox verify`'s "applied lsn"),
/// without which the kinds that damage records are not planned.
pub fn plan(
    kind: &str,
    data: &Path,
    applied: Option<u64>,
    rng: &mut fastrand::Rng,
) -> Option<Damage> {
    let kind = KINDS.iter().copied().find(|k| *k == kind)?;
    let cp = parse_checkpoint(&std::fs::read_to_string(data.join("CHECKPOINT")).ok()?)?;
    let (s, first) = cp.log?;
    let wal = data.join("wal");
    let present = list_segments(&wal);
    if !present.contains(&s) {
        // The start refuses this directory already; nothing to add.
        return None;
    }
    let log = Log {
        wal,
        present,
        s,
        first,
        cp,
    };
    match kind {
        "delete-log" | "delete-between" | "delete-all" | "zero" | "truncate" => {
            log.plan_segment(kind, rng)
        }
        "zero-page" => log.plan_zero_page(applied?, rng),
        "damage-frames" => log.plan_damage_frames(applied?, rng),
        "truncate-new" | "zero-new" => log.plan_new_segment(kind, rng),
        "zero-tail" => log.plan_zero_tail(rng),
        _ => None,
    }
}

/// The log as the checkpoint and the segments present describe it.
struct Log {
    wal: PathBuf,
    /// The segments present, by number.
    present: Vec<u64>,
    /// The checkpoint's segment, S.
    s: u64,
    /// The lsn of S's first record, F.
    first: u64,
    cp: Checkpoint,
}

impl Log {
    fn seg(&self, n: u64) -> PathBuf {
        segment_path(&self.wal, n)
    }

    fn len(&self, n: u64) -> u64 {
        std::fs::metadata(self.seg(n)).map_or(0, |m| m.len())
    }

    fn one(&self, kind: &'static str, n: u64, a: Action) -> Damage {
        Damage {
            kind,
            files: vec![(self.seg(n), a)],
            must_refuse: true,
        }
    }

    /// The kinds that delete, zero or cut whole segments the start reads.
    fn plan_segment(&self, kind: &'static str, rng: &mut fastrand::Rng) -> Option<Damage> {
        let (s, first, present) = (self.s, self.first, &self.present);
        match kind {
            // Refused: the checkpoint says the log goes on in it.
            "delete-log" => Some(self.one(kind, s, Action::Delete)),
            // Refused: from S on the segments must be consecutive (or, when
            // `sizes` lists it, it must exist).
            "delete-between" => {
                let last = *present.last()?;
                let between: Vec<u64> = present
                    .iter()
                    .copied()
                    .filter(|&n| n > s && n < last)
                    .collect();
                (!between.is_empty())
                    .then(|| self.one(kind, between[rng.usize(..between.len())], Action::Delete))
            }
            // Refused: S is missing.
            "delete-all" => Some(Damage {
                kind,
                files: present
                    .iter()
                    .map(|&n| (self.seg(n), Action::Delete))
                    .collect(),
                must_refuse: true,
            }),
            // Refused when S's first record was durable at the checkpoint
            // (F <= N), when the next segment's first record comes after it
            // (the log filled S), or when `sizes` lists it with its first
            // record (noted before any record in it was answered): then it
            // must still be S's first intact frame. Otherwise S holds no
            // answered record: not applied.
            "zero" => {
                let moved_on = first_lsn(&self.seg(s + 1)).is_some_and(|l| l > first);
                let listed = self.cp.first_of(s).is_some();
                ((first <= self.cp.applied || moved_on || listed) && self.len(s) > 0)
                    .then(|| self.one(kind, s, Action::ZeroFrom(0)))
            }
            // Refused: shorter than the size `sizes` recorded.
            "truncate" => {
                let listed: Vec<(u64, u64)> = self
                    .cp
                    .sizes
                    .iter()
                    .map(|&(n, size, _)| (n, size))
                    .filter(|&(n, size)| size >= 2 && self.len(n) >= size)
                    .collect();
                if listed.is_empty() {
                    return None;
                }
                let (n, size) = listed[rng.usize(..listed.len())];
                Some(self.one(kind, n, Action::Truncate(size / 2)))
            }
            _ => None,
        }
    }

    /// A 4 KiB page zeroed over records in the middle of the newest
    /// segment (not its first record, which `sizes` guards, and with the
    /// records of a later write after it): only the look past the
    /// records' end can see it.
    fn plan_zero_page(&self, applied: u64, rng: &mut fastrand::Rng) -> Option<Damage> {
        let (n, recs) = newest_records(&self.wal, &self.present, self.s)?;
        let mut candidates = Vec::new();
        let end = recs.last().map_or(0, Rec::end);
        for page in (recs[0].end().div_ceil(PAGE)..end.div_ceil(PAGE)).map(|k| k * PAGE) {
            if page + PAGE > self.len(n) {
                break;
            }
            let hit = |r: &&Rec| r.offset < page + PAGE && r.end() > page;
            let Some(first_hit) = recs.iter().find(hit) else {
                continue;
            };
            let after = recs.iter().filter(|r| r.offset >= page + PAGE);
            if stop_refused(first_hit.lsn, applied, after) {
                candidates.push((self.seg(n), Action::ZeroRange(page, PAGE)));
            }
        }
        pick("zero-page", candidates, true, rng)
    }

    /// A byte damaged in each of two or three records in a row in the
    /// middle of the newest segment, as for `zero-page`.
    fn plan_damage_frames(&self, applied: u64, rng: &mut fastrand::Rng) -> Option<Damage> {
        let (n, recs) = newest_records(&self.wal, &self.present, self.s)?;
        let k = rng.usize(2..=3);
        let mut candidates = Vec::new();
        for (i, w) in recs.windows(k).enumerate().skip(1) {
            if w.iter().any(|r| r.len <= HEADER as u64 + 4) {
                continue;
            }
            if stop_refused(w[0].lsn, applied, recs[i + k..].iter()) {
                let at = w.iter().map(|r| r.offset + r.len - 2).collect();
                candidates.push((self.seg(n), Action::Flip(at)));
            }
        }
        pick("damage-frames", candidates, true, rng)
    }

    /// The newest segment the log moved into after S, cut short or
    /// zeroed: refused when `sizes` lists it with its first record (the
    /// log writer lists it before answering any record in it; a crash can
    /// fall between its first write and that note, and then nothing in it
    /// was answered).
    fn plan_new_segment(&self, kind: &'static str, rng: &mut fastrand::Rng) -> Option<Damage> {
        // The segment holding the newest records (a later-numbered
        // one may be a reused spare still holding older ones).
        let (n, _) = newest_records(&self.wal, &self.present, self.s)?;
        if n == self.s {
            return None;
        }
        let listed = self.cp.first_of(n) == first_lsn(&self.seg(n));
        let action = if kind == "zero-new" {
            Action::ZeroFrom(0)
        } else {
            Action::Truncate(rng.u64(0..self.len(n)))
        };
        Some(Damage {
            kind,
            files: vec![(self.seg(n), action)],
            must_refuse: listed,
        })
    }

    /// Allowed to go unnoticed, and harmless: bytes after the last intact
    /// record of the log, that are not all zero (a reused segment's older
    /// records, a torn write): in the segment whose first record is the
    /// newest, after its records, or a whole later segment (its records,
    /// if any, are older: left from its earlier life).
    fn plan_zero_tail(&self, rng: &mut fastrand::Rng) -> Option<Damage> {
        let (newest_first, newest) = self
            .present
            .iter()
            .copied()
            .filter(|&n| n >= self.s)
            .filter_map(|n| Some((first_lsn(&self.seg(n))?, n)))
            .max()?;
        let mut candidates = Vec::new();
        for n in self.present.iter().copied().filter(|&n| n >= newest) {
            let Ok(data) = std::fs::read(self.seg(n)) else {
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
                candidates.push((self.seg(n), Action::ZeroFrom(from as u64)));
            }
        }
        (!candidates.is_empty()).then(|| Damage {
            kind: "zero-tail",
            files: vec![candidates.swap_remove(rng.usize(..candidates.len()))],
            must_refuse: false,
        })
    }
}

/// One of `candidates` (segment, action), at random.
fn pick(
    kind: &'static str,
    mut candidates: Vec<(PathBuf, Action)>,
    must_refuse: bool,
    rng: &mut fastrand::Rng,
) -> Option<Damage> {
    (!candidates.is_empty()).then(|| Damage {
        kind,
        files: vec![candidates.swap_remove(rng.usize(..candidates.len()))],
        must_refuse,
    })
}

/// A record of the log: where it is and its lsns.
#[derive(Debug, Clone, Copy)]
struct Rec {
    offset: u64,
    len: u64,
    lsn: u64,
    batch_first: u64,
}

impl Rec {
    fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// The segment from `s` on whose first record is the log's newest, with
/// its records in order.
fn newest_records(wal: &Path, present: &[u64], s: u64) -> Option<(u64, Vec<Rec>)> {
    let (_, n) = present
        .iter()
        .copied()
        .filter(|&n| n >= s)
        .filter_map(|n| Some((first_lsn(&segment_path(wal, n))?, n)))
        .max()?;
    let data = std::fs::read(segment_path(wal, n)).ok()?;
    let mut out: Vec<Rec> = Vec::new();
    let mut pos = 0usize;
    while let Some((lsn, len)) = frame_at(&data, pos) {
        if out.last().is_some_and(|r| lsn <= r.lsn) {
            break;
        }
        let bf = u64::from_le_bytes(data[pos + 16..pos + 24].try_into().unwrap_or([0; 8]));
        out.push(Rec {
            offset: pos as u64,
            len: len as u64,
            lsn,
            batch_first: bf,
        });
        pos += len;
    }
    (!out.is_empty()).then_some((n, out))
}

/// Whether a start must refuse the log's records stopping at record
/// `lsn` (damaged) with `after` following: when the database lacks that
/// record, no record of a later write may follow. Damage to records the
/// database holds is not planned: a start need not read their segment
/// again (it may be kept only for the bodies it holds, whose damage is
/// found when they are read), so it may start, and the message whose
/// body was hit is lost by design.
fn stop_refused<'a>(lsn: u64, applied: u64, mut after: impl Iterator<Item = &'a Rec>) -> bool {
    lsn > applied && after.any(|r| r.batch_first > lsn)
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
            Action::ZeroRange(at, len) => {
                use std::os::unix::fs::FileExt;
                let f = std::fs::OpenOptions::new().write(true).open(path)?;
                f.write_all_at(&vec![0u8; *len as usize], *at)
                    .with_context(|| format!("zeroing {}", path.display()))?;
                f.sync_all()?;
            }
            Action::Flip(at) => {
                use std::os::unix::fs::FileExt;
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)?;
                for &o in at {
                    let mut b = [0u8; 1];
                    f.read_exact_at(&mut b, o)?;
                    b[0] ^= 0x20;
                    f.write_all_at(&b, o)
                        .with_context(|| format!("damaging {}", path.display()))?;
                }
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
        assert_eq!(cp.sizes, vec![(3, 1024, None), (4, 2048, None)]);
        let listed =
            parse_checkpoint("letterbox checkpoint\napplied 42\nlog 3 40\nsizes 3:1024:40\n")
                .unwrap();
        assert_eq!(listed.sizes, vec![(3, 1024, Some(40))]);
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
        let p = |k: &str, rng: &mut fastrand::Rng| plan(k, d.path(), Some(40), rng).unwrap();
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
        assert!(plan("zero-tail", d.path(), Some(40), &mut rng).is_none());
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
        assert!(plan("zero", d.path(), Some(40), &mut rng).is_none());
        assert!(plan("delete-between", d.path(), Some(40), &mut rng).is_none());
        let tail = plan("zero-tail", d.path(), Some(40), &mut rng).unwrap();
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
        let zero = plan("zero", d.path(), Some(40), &mut rng).unwrap();
        assert_eq!(zero.files[0].1, Action::ZeroFrom(0));
        let tail = plan("zero-tail", d.path(), Some(40), &mut rng).unwrap();
        assert_eq!(
            tail.files[0],
            (segment_path(&d.path().join("wal"), 5), Action::ZeroFrom(0))
        );
    }

    /// Segment 3 with records 41..=60 (about 300 bytes each) and segment
    /// 4 with 61..=100, the checkpoint at 40; segment 4 listed or not.
    fn two_segments(listed: bool) -> tempfile::TempDir {
        let body = vec![b'b'; 280];
        let mut s3 = Vec::new();
        for lsn in 41..=60 {
            s3.extend(frame(lsn, &body));
        }
        s3.resize(16384, 0);
        let mut s4 = Vec::new();
        for lsn in 61..=100 {
            s4.extend(frame(lsn, &body));
        }
        s4.resize(16384, 0);
        let four = if listed { " 4:16384:61" } else { "" };
        dir_with(
            &format!("letterbox checkpoint\napplied 40\nlog 3 41\nsizes 3:16384:41{four}\n"),
            &[(3, s3), (4, s4)],
        )
    }

    #[test]
    fn damage_to_records_is_planned_only_where_a_later_record_must_be_refused() {
        let d = two_segments(true);
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..20 {
            let page = plan("zero-page", d.path(), Some(40), &mut rng).unwrap();
            assert!(page.must_refuse);
            let Action::ZeroRange(at, len) = page.files[0].1 else {
                panic!("{page:?}")
            };
            // In the newest segment, past its first record.
            assert!(page.files[0].0.ends_with("00000000000000000004.wal"));
            assert_eq!((at % PAGE, len), (0, PAGE));
            assert!(at > 0);
            let frames = plan("damage-frames", d.path(), Some(40), &mut rng).unwrap();
            let Action::Flip(at) = &frames.files[0].1 else {
                panic!("{frames:?}")
            };
            assert!((2..=3).contains(&at.len()), "{frames:?}");
            assert!(frames.files[0].0.ends_with("00000000000000000004.wal"));
            assert!(at[0] > 304, "not the first record: {frames:?}");
        }
        // The database holds every record: damage to them loses nothing
        // and nothing unapplied follows, so there is nothing to refuse.
        assert!(plan("zero-page", d.path(), Some(100), &mut rng).is_none());
        assert!(plan("damage-frames", d.path(), Some(100), &mut rng).is_none());
        // Unknown how far the database got: not planned.
        assert!(plan("zero-page", d.path(), None, &mut rng).is_none());
    }

    #[test]
    fn the_newest_segment_must_be_refused_once_listed_with_its_first_record() {
        let mut rng = fastrand::Rng::with_seed(3);
        let listed = two_segments(true);
        let zero = plan("zero-new", listed.path(), Some(40), &mut rng).unwrap();
        assert!(zero.must_refuse);
        assert_eq!(zero.files[0].1, Action::ZeroFrom(0));
        assert!(zero.files[0].0.ends_with("00000000000000000004.wal"));
        let cut = plan("truncate-new", listed.path(), Some(40), &mut rng).unwrap();
        assert!(cut.must_refuse);
        assert!(matches!(cut.files[0].1, Action::Truncate(n) if n < 16384));
        // Not listed: a crash fell between its first write and the note,
        // so nothing in it was answered.
        let unlisted = two_segments(false);
        assert!(
            !plan("zero-new", unlisted.path(), Some(40), &mut rng)
                .unwrap()
                .must_refuse
        );
        let backup = unlisted.path().join("backup");
        let frames = plan("damage-frames", unlisted.path(), Some(40), &mut rng).unwrap();
        let path = frames.files[0].0.clone();
        let before = std::fs::read(&path).unwrap();
        apply(&frames, &backup).unwrap();
        let after = std::fs::read(&path).unwrap();
        let Action::Flip(at) = &frames.files[0].1 else {
            panic!()
        };
        let changed: Vec<u64> = (0..before.len())
            .filter(|&i| before[i] != after[i])
            .map(|i| i as u64)
            .collect();
        assert_eq!(&changed, at);
        restore(&frames, &backup).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), before);
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
