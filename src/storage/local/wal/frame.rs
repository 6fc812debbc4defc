//! Frames and the encoding of transactions (see the module doc of `wal`).

use bytes::{Buf, Bytes};

use super::Mutation;

/// Size of a frame header.
pub const HEADER: usize = 24;

/// Appends the encoding of one transaction to `out`; returns, for each
/// value whose key satisfies `locate`, (mutation index, offset of the value
/// from the start of `out`).
pub fn encode_txn_locating(
    muts: &[Mutation],
    out: &mut Vec<u8>,
    locate: impl Fn(&[u8]) -> bool,
) -> Vec<(usize, usize)> {
    let mut located = Vec::new();
    out.extend_from_slice(&u32::try_from(muts.len()).unwrap_or(u32::MAX).to_le_bytes());
    for (i, m) in muts.iter().enumerate() {
        let klen = u16::try_from(m.key.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&klen.to_le_bytes());
        out.extend_from_slice(&m.key[..usize::from(klen)]);
        match &m.value {
            None => out.push(0),
            Some(v) => {
                out.push(if m.if_exists { 2 } else { 1 });
                out.extend_from_slice(&u32::try_from(v.len()).unwrap_or(u32::MAX).to_le_bytes());
                if locate(&m.key) {
                    located.push((i, out.len()));
                }
                out.extend_from_slice(v);
            }
        }
    }
    located
}

/// Appends the encoding of one transaction to `out`.
pub fn encode_txn(muts: &[Mutation], out: &mut Vec<u8>) {
    encode_txn_locating(muts, out, |_| false);
}

/// Size of the encoding of one transaction.
pub fn encoded_len(muts: &[Mutation]) -> usize {
    4 + muts
        .iter()
        .map(|m| 3 + m.key.len() + m.value.as_ref().map_or(0, |v| 4 + v.len()))
        .sum::<usize>()
}

/// Decodes a transaction payload; the mutations share `payload`'s memory.
pub fn decode_txn(payload: &Bytes) -> std::result::Result<Vec<Mutation>, String> {
    let mut buf = payload.clone();
    let need = |buf: &Bytes, n: usize| {
        if buf.remaining() < n {
            Err(format!(
                "transaction truncated: {} bytes left, {n} needed",
                buf.remaining()
            ))
        } else {
            Ok(())
        }
    };
    need(&buf, 4)?;
    let count = buf.get_u32_le();
    let mut muts = Vec::with_capacity(usize::try_from(count.min(1 << 16)).unwrap_or(0));
    for _ in 0..count {
        need(&buf, 2)?;
        let klen = usize::from(buf.get_u16_le());
        need(&buf, klen + 1)?;
        let key = buf.split_to(klen);
        let tag = buf.get_u8();
        let value = match tag {
            0 => None,
            1 | 2 => {
                need(&buf, 4)?;
                let vlen = usize::try_from(buf.get_u32_le()).map_err(|e| e.to_string())?;
                need(&buf, vlen)?;
                Some(buf.split_to(vlen))
            }
            t => return Err(format!("unknown mutation tag {t}")),
        };
        muts.push(Mutation {
            key,
            value,
            fresh: false,
            if_exists: tag == 2,
        });
    }
    if buf.has_remaining() {
        return Err(format!("{} stray bytes after transaction", buf.remaining()));
    }
    Ok(muts)
}

/// Appends one framed record to `out`; returns (mutation index, offset of
/// the value from the start of the frame) for each value whose key
/// satisfies `locate`.
pub fn frame(
    lsn: u64,
    batch_first: u64,
    muts: &[Mutation],
    out: &mut Vec<u8>,
    locate: impl Fn(&[u8]) -> bool,
) -> Vec<(usize, usize)> {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER]);
    let located = encode_txn_locating(muts, out, locate)
        .into_iter()
        .map(|(i, off)| (i, off - start))
        .collect();
    let len = u32::try_from(out.len() - start - HEADER).unwrap_or(u32::MAX);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 8..start + 16].copy_from_slice(&lsn.to_le_bytes());
    out[start + 16..start + 24].copy_from_slice(&batch_first.to_le_bytes());
    let crc = crc32fast::hash(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    located
}

/// A frame read back from a segment.
pub(super) struct RawFrame {
    pub(super) lsn: u64,
    pub(super) payload: Bytes,
    pub(super) len: usize,
}

/// Parses the frame at `pos`; `None` if it is zero, truncated or damaged.
pub(super) fn parse_frame(data: &Bytes, pos: usize) -> Option<RawFrame> {
    let header = data.get(pos..pos + HEADER)?;
    let len = usize::try_from(u32::from_le_bytes(header[0..4].try_into().ok()?)).ok()?;
    if len == 0 {
        return None;
    }
    let crc = u32::from_le_bytes(header[4..8].try_into().ok()?);
    let end = pos.checked_add(HEADER)?.checked_add(len)?;
    let body = data.get(pos + 8..end)?;
    if crc32fast::hash(body) != crc {
        return None;
    }
    Some(RawFrame {
        lsn: u64::from_le_bytes(header[8..16].try_into().ok()?),
        payload: data.slice(pos + HEADER..end),
        len: HEADER + len,
    })
}

/// The transactions of every intact frame of a segment's data, from the
/// start until the first frame that is zero or damaged.
pub fn frames(data: &Bytes) -> impl Iterator<Item = Vec<Mutation>> + '_ {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        let f = parse_frame(data, pos)?;
        pos += f.len;
        decode_txn(&f.payload).ok()
    })
}

/// The lsns of a segment's records: its intact frames from the start, as
/// long as their lsns go up (older records of a reused segment follow).
pub fn frame_lsns(data: &Bytes) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    let mut pos = 0usize;
    while let Some(f) = parse_frame(data, pos) {
        if out.last().is_some_and(|&l| f.lsn <= l) {
            break;
        }
        out.push(f.lsn);
        pos += f.len;
    }
    out
}

/// Length field of the frame at `pos`, if its header is readable.
pub(super) fn frame_len_hint(data: &[u8], pos: usize) -> Option<usize> {
    let header = data.get(pos..pos + 4)?;
    let len = usize::try_from(u32::from_le_bytes(header.try_into().ok()?)).ok()?;
    (len > 0).then_some(HEADER + len)
}
