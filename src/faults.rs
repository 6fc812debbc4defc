//! Fault injection: the negative controls of the crash tests
//! (RELIABILITY.md, "Negative controls"; `tools/reliability/chaos-controls.sh`).
//!
//! Each [`Fault`] breaks one durability or ordering rule on purpose, so
//! that the chaos tool can show it catches the break. The engine asks
//! [`on`] at each place a fault changes what it does:
//!
//! ```ignore
//! if faults::on(Fault::DlqTwoSteps) {
//!     // the broken way
//! } else {
//!     // the real way
//! }
//! ```
//!
//! Without the cargo feature `fault-injection` (every real build), [`on`]
//! is a `const fn` that returns `false` and is always inlined, so each
//! fault branch is dead code the compiler removes; nothing reads the
//! environment. The fault branches are still type-checked in every build,
//! so they cannot rot unseen.
//!
//! With the feature, one fault (or none) is chosen when the process
//! starts, by [`init`], from the environment variable [`ENV`]:
//! `LETTERBOX_FAULT=dlq-two-steps letterbox serve ...`. Unset or empty
//! means no fault; a name that is not one of [`Fault::ALL`] is refused, and
//! the binary exits before doing anything else. A process that never calls
//! [`init`] (a test using the library) runs with no fault.
//!
//! **Failing reads.** The engine's tests of all-or-nothing operations
//! (`queue/undo_tests.rs`) also need a read of one stored record to fail in
//! the middle of an operation, chosen at run time by the test:
//! `fail_reads` makes every read of one key by the calling thread fail
//! (the engine reads under its lock on the caller's thread) until the
//! returned `FailingRead` is dropped, and `Store::get` asks
//! [`read_fails`] (`fail_reads` and `FailingRead` exist in tests and the
//! `fault-injection` build only). Like [`on`], [`read_fails`] is a constant false in a
//! build without tests or the feature.

/// The environment variable that names the fault (builds with the
/// `fault-injection` feature only).
pub const ENV: &str = "LETTERBOX_FAULT";

/// A rule broken on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `ack-before-fsync`: a group commit answers after its log write but
    /// without its fdatasync, which is left to the next group commit
    /// (`storage/local/wal/writer.rs`).
    AckBeforeFsync,
    /// `no-delivery-count`: the delivery count raised by a lease (and the
    /// lease) is kept in memory only, until something else writes the
    /// message's record (`queue/receive.rs`, `storage/txn.rs`,
    /// `storage/local/submit.rs`, `storage/local/read.rs`).
    NoDeliveryCount,
    /// `dlq-two-steps`: a dead-letter move writes the DLQ copy, waits for
    /// it to be durable, and removes the source 100 ms later in another
    /// transaction (`queue/dlq.rs`).
    DlqTwoSteps,
    /// `exchange-two-steps`: a publish through an exchange whose messages
    /// go to more than one queue writes the first queue's copies in a
    /// transaction of its own, waits for it to be durable, and the rest
    /// 100 ms later (`queue/exchange.rs`).
    ExchangeTwoSteps,
    /// `no-fifo-release`: a failed FIFO message does not release the later
    /// messages of its group leased with it (SPEC §3), so they can be acked
    /// ahead of its redelivery (`queue/dlq.rs`).
    NoFifoRelease,
    /// `no-log-continuity`: the start does not check that the log goes on
    /// where the last checkpoint says (a missing, zeroed or truncated
    /// segment is not refused; `storage/local/open.rs`).
    NoLogContinuity,
    /// `no-later-write-scan`: replay takes the first place the log's
    /// records stop as its end without looking past it for records of
    /// later writes (a zeroed page or damaged records in the middle of the
    /// log are taken as a torn tail; `storage/local/wal/replay.rs`).
    NoLaterWriteScan,
    /// `no-segment-notes`: the log writer answers records written into a
    /// segment before `CHECKPOINT` lists it, and no checkpoint lists a
    /// segment's first record (a segment the log moved into since the
    /// last checkpoint can be truncated or zeroed unnoticed;
    /// `storage/local/checkpoint.rs`).
    NoSegmentNotes,
}

impl Fault {
    /// Every fault.
    pub const ALL: [Fault; 8] = [
        Fault::AckBeforeFsync,
        Fault::NoDeliveryCount,
        Fault::DlqTwoSteps,
        Fault::ExchangeTwoSteps,
        Fault::NoFifoRelease,
        Fault::NoLogContinuity,
        Fault::NoLaterWriteScan,
        Fault::NoSegmentNotes,
    ];

    /// The name [`ENV`] takes.
    pub const fn name(self) -> &'static str {
        match self {
            Fault::AckBeforeFsync => "ack-before-fsync",
            Fault::NoDeliveryCount => "no-delivery-count",
            Fault::DlqTwoSteps => "dlq-two-steps",
            Fault::ExchangeTwoSteps => "exchange-two-steps",
            Fault::NoFifoRelease => "no-fifo-release",
            Fault::NoLogContinuity => "no-log-continuity",
            Fault::NoLaterWriteScan => "no-later-write-scan",
            Fault::NoSegmentNotes => "no-segment-notes",
        }
    }

    /// Reads a value of [`ENV`]: `Ok(None)` for empty (no fault), an
    /// error naming the known faults for anything else that is not one.
    pub fn parse(value: &str) -> Result<Option<Fault>, String> {
        if value.is_empty() {
            return Ok(None);
        }
        Fault::ALL
            .into_iter()
            .find(|f| f.name() == value)
            .map(Some)
            .ok_or_else(|| {
                let known: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
                format!(
                    "{ENV}={value:?} is not a fault (known: {}; unset or empty for none)",
                    known.join(", ")
                )
            })
    }
}

/// Whether `fault` is on. Without the `fault-injection` feature: never,
/// decided at compile time.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub const fn on(fault: Fault) -> bool {
    let _ = fault;
    false
}

/// Chooses the fault from [`ENV`]. Without the `fault-injection` feature
/// it does nothing and reads nothing.
///
/// # Errors
///
/// Never without the feature.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn init() -> Result<Option<Fault>, String> {
    Ok(None)
}

#[cfg(feature = "fault-injection")]
static CHOSEN: std::sync::OnceLock<Option<Fault>> = std::sync::OnceLock::new();

/// Whether `fault` is the one chosen at start (see [`init`]).
#[cfg(feature = "fault-injection")]
#[inline]
pub fn on(fault: Fault) -> bool {
    CHOSEN.get().copied().flatten() == Some(fault)
}

/// Chooses the fault from [`ENV`], once, before anything else runs;
/// returns it. A later call returns the first choice.
///
/// # Errors
///
/// When [`ENV`] is not valid UTF-8 or names no fault: the caller must
/// refuse to start.
#[cfg(feature = "fault-injection")]
pub fn init() -> Result<Option<Fault>, String> {
    if let Some(f) = CHOSEN.get() {
        return Ok(*f);
    }
    let chosen = match std::env::var(ENV) {
        Ok(v) => Fault::parse(&v)?,
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(v)) => {
            return Err(format!("{ENV}={v:?} is not a fault (not UTF-8)"));
        }
    };
    Ok(*CHOSEN.get_or_init(|| chosen))
}

/// A key whose reads fail, with its count of failed reads.
#[cfg(any(test, feature = "fault-injection"))]
type FailingKey = (Vec<u8>, std::rc::Rc<std::cell::Cell<u32>>);

#[cfg(any(test, feature = "fault-injection"))]
thread_local! {
    /// The keys whose reads fail on this thread.
    static FAILING_READS: std::cell::RefCell<Vec<FailingKey>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Reads of one key failing on purpose (see [`fail_reads`]); dropping it
/// ends them.
#[cfg(any(test, feature = "fault-injection"))]
#[derive(Debug)]
#[must_use = "the reads fail only while this is held"]
pub struct FailingRead {
    key: Vec<u8>,
    hits: std::rc::Rc<std::cell::Cell<u32>>,
}

#[cfg(any(test, feature = "fault-injection"))]
impl FailingRead {
    /// How many reads failed so far.
    pub fn hits(&self) -> u32 {
        self.hits.get()
    }
}

#[cfg(any(test, feature = "fault-injection"))]
impl Drop for FailingRead {
    fn drop(&mut self) {
        FAILING_READS.with(|f| f.borrow_mut().retain(|(k, _)| *k != self.key));
    }
}

/// Makes every read of the stored record at `key` (an encoded storage
/// key) by this thread fail, until the returned guard is dropped.
#[cfg(any(test, feature = "fault-injection"))]
pub fn fail_reads(key: Vec<u8>) -> FailingRead {
    let hits = std::rc::Rc::new(std::cell::Cell::new(0));
    FAILING_READS.with(|f| f.borrow_mut().push((key.clone(), hits.clone())));
    FailingRead { key, hits }
}

/// Whether this read of `key` must fail ([`fail_reads`]); counts it.
#[cfg(any(test, feature = "fault-injection"))]
pub fn read_fails(key: &[u8]) -> bool {
    FAILING_READS.with(|f| match f.borrow().iter().find(|(k, _)| k == key) {
        Some((_, hits)) => {
            hits.set(hits.get() + 1);
            true
        }
        None => false,
    })
}

/// Whether this read of `key` must fail: never, decided at compile time,
/// in a build without tests or the `fault-injection` feature.
#[cfg(not(any(test, feature = "fault-injection")))]
#[inline(always)]
pub const fn read_fails(key: &[u8]) -> bool {
    let _ = key;
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_reads_back_and_others_are_refused() {
        for f in Fault::ALL {
            assert_eq!(Fault::parse(f.name()), Ok(Some(f)));
        }
        assert_eq!(Fault::parse(""), Ok(None));
        let e = Fault::parse("dlq-two-step").expect_err("a near miss is refused");
        assert!(e.contains("LETTERBOX_FAULT=\"dlq-two-step\""), "{e}");
        assert!(
            e.contains("dlq-two-steps"),
            "the known names are listed: {e}"
        );
    }

    #[test]
    fn a_failing_read_fails_its_key_on_its_thread_while_held() {
        assert!(!read_fails(b"k"));
        let failing = fail_reads(b"k".to_vec());
        assert!(read_fails(b"k"));
        assert!(!read_fails(b"other"));
        let elsewhere = std::thread::spawn(|| read_fails(b"k"))
            .join()
            .expect("thread");
        assert!(!elsewhere, "another thread's reads are not failed");
        assert_eq!(failing.hits(), 1);
        drop(failing);
        assert!(!read_fails(b"k"));
    }

    #[test]
    fn no_fault_is_on_unless_chosen() {
        // The unit tests never call `init`, so even with the feature no
        // fault is on.
        for f in Fault::ALL {
            assert!(!on(f));
        }
    }
}
