//! The write-ahead log: append-only segment files of framed records.
//!
//! ## Record frame
//!
//! ```text
//! offset  size  field
//! 0       4     len          payload length, u32 little-endian, > 0
//! 4       4     crc          CRC-32 of bytes 8 .. 24+len
//! 8       8     lsn          log sequence number, u64 LE, +1 per record
//! 16      8     batch_first  lsn of the first record of the same write
//! 24      len   payload      one transaction (see `encode_txn`)
//! ```
//!
//! A transaction payload is `count: u32` followed by `count` mutations,
//! each `klen: u16, key, tag: u8` (0 delete, 1 put) and, for a put,
//! `vlen: u32, value`. All integers little-endian.
//!
//! ## Segments
//!
//! Segments are `wal/<number>.wal`, numbered upwards, and are filled with
//! zeros and fsynced (file and directory) by a preallocation thread before
//! the writer uses them, so that appending to them later is an overwrite of
//! allocated blocks: `fdatasync` then has no metadata to commit. A record
//! never spans two segments.
//!
//! ## Reading back
//!
//! Replay reads segments in order; within a segment it reads frames until
//! one is zero or fails its CRC (the rest of the segment is unused, or the
//! tail of a write torn by a crash). The log ends at the first segment that
//! holds no frame. Damage is told apart from a torn tail: if an intact frame
//! of a *later* write (its `batch_first` is past the broken frame) follows
//! a broken one, or a segment does not continue the previous one's lsns,
//! durable data was damaged and replay refuses to go on rather than drop
//! acknowledged records.
//!
//! ## Files
//!
//! `frame` (the frame and transaction encoding), `segment` (segment
//! names, the pool of retired segments), `prealloc` (segments prepared
//! ahead of the writer), `writer` (the writing end), `replay` (reading
//! back: a segment's frames, the continuity check, replay).

mod frame;
mod prealloc;
mod replay;
mod segment;
mod writer;

pub use frame::{
    HEADER, decode_txn, encode_txn, encode_txn_locating, encoded_len, frame, frame_lsns, frames,
};
pub use prealloc::{Preallocator, preallocate};
pub(crate) use replay::read_frames;
pub use replay::{ReplayEnd, check_continuity, replay};
pub use segment::{Pool, Segment, list_segments, segment_path};
pub use writer::{Writer, Wrote};

/// The changes a log record holds (defined with the transactions that
/// carry them).
pub use crate::storage::txn::Mutation;

#[cfg(test)]
mod tests;
