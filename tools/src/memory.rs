//! `index-memory`: the heap that queued messages hold after a start,
//! counted allocation by allocation, split between the store (sled's page
//! table and cache, the store's own maps) and the engine's indexes.
//!
//! 1. Fills one standard queue in a fresh data directory, in process
//!    (`Broker::publish`, `--batch` messages per call), with `--messages`
//!    messages of `--size` bytes, and closes it (graceful: everything
//!    applied and checkpointed).
//! 2. Opens the directory again as the server does, in two steps, and
//!    reads the live heap bytes (the binary's global allocator counts every
//!    allocation and free; it is the system allocator underneath, so the
//!    counts are the bytes asked for, without the allocator's own slack)
//!    before, after `Store::open` and after `Broker::open`, which rebuilds
//!    the indexes from the store.
//! 3. Prints each part in bytes per queued message. The split is by step,
//!    not by owner: sled's page cache fills (up to its bound) while the
//!    rebuild reads the messages' records, and that counts in the second
//!    step; the sum of the two is exact.
//!
//! The server's RSS after a start (`scale`, BENCHMARKS.md) is these parts
//! plus the allocator's slack, the code and what an empty server holds.

// Figures: the casts between counts and floats are intended.
#![allow(clippy::cast_precision_loss)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context as _, Result};
use bytes::Bytes;
use clap::Parser;
use letterbox::clock::SystemClock;
use letterbox::queue::model::{NewMessage, QueueConfigInput};
use letterbox::queue::{Broker, BrokerOptions};
use letterbox::storage::{Store, StoreOptions};

/// The system allocator, counting the bytes it has handed out and not got
/// back.
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator with the caller's own
// arguments; the counter only adds and subtracts the layouts' sizes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is (the caller upholds `alloc`'s contract).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE.fetch_add(new_size, Ordering::Relaxed);
        }
        p
    }
}

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

#[derive(Parser, Debug)]
#[command(
    name = "index-memory",
    about = "Heap held per queued message after a start: store and engine indexes"
)]
struct Args {
    /// Messages to queue.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    messages: u64,
    /// Message body bytes.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Messages per publish call while filling.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    batch: u64,
    /// sled's page cache, in bytes, when the directory is opened again
    /// (the server's `--cache-size`; its default is 256 MiB).
    #[arg(long, default_value_t = 8 << 20)]
    cache_bytes: u64,
    /// Data directory: absent, empty, or a Letterbox data directory, which
    /// is wiped first. A temporary one by default.
    #[arg(long)]
    dir: Option<PathBuf>,
}

async fn fill(dir: &std::path::Path, args: &Args) -> Result<()> {
    let (broker, _) = Broker::start(
        dir,
        StoreOptions::default(),
        Arc::new(SystemClock),
        BrokerOptions::default(),
    )?;
    broker
        .create_queue("q", &QueueConfigInput::default())
        .await
        .context("creating the queue")?;
    let body = Bytes::from(vec![b'x'; args.size]);
    let started = Instant::now();
    let mut left = args.messages;
    while left > 0 {
        let n = left.min(args.batch);
        let msgs = (0..n)
            .map(|_| NewMessage {
                body: body.clone(),
                ..NewMessage::default()
            })
            .collect();
        broker.publish("q", msgs).await.context("publishing")?;
        left -= n;
    }
    eprintln!(
        "filled {} messages of {} B in {:.1} s",
        args.messages,
        args.size,
        started.elapsed().as_secs_f64()
    );
    broker.close().context("closing after the fill")?;
    Ok(())
}

/// Empties `dir` for the fill when it is a Letterbox data directory (it
/// holds `FORMAT`) or empty; refuses anything else.
fn wipe(dir: &std::path::Path) -> Result<()> {
    let Ok(mut entries) = std::fs::read_dir(dir) else {
        return Ok(()); // absent: the fill creates it
    };
    if entries.next().is_some() && !dir.join("FORMAT").exists() {
        anyhow::bail!(
            "refusing to wipe {}: not empty and not a Letterbox data directory",
            dir.display()
        );
    }
    std::fs::remove_dir_all(dir).with_context(|| format!("wiping {}", dir.display()))
}

/// Runs the tool.
pub fn main() -> Result<()> {
    let args = Args::parse();
    let tmp;
    let dir = if let Some(d) = &args.dir {
        wipe(d)?;
        d.clone()
    } else {
        tmp = tempfile::tempdir_in(std::env::temp_dir())?;
        tmp.path().join("data")
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(fill(&dir, &args))?;

    let n = args.messages as f64;
    let before = live();
    let opts = StoreOptions {
        cache_bytes: args.cache_bytes,
        ..StoreOptions::default()
    };
    let started = Instant::now();
    let (store, _) = Store::open(&dir, opts).context("opening the store")?;
    let opened = live();
    let broker = Broker::open(store, Arc::new(SystemClock), BrokerOptions::default())
        .context("rebuilding the indexes")?;
    let elapsed = started.elapsed();
    let built = live();
    // Signed: sled's cache may give back during the rebuild what it took
    // while the store opened.
    let per = |from: usize, to: usize| (to as f64 - from as f64) / n;
    println!(
        "| messages | body | sled cache | store (sled and its maps) | engine indexes | both | open + rebuild |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} B | {:.1} MiB | {:.1} B/msg | {:.1} B/msg | {:.1} B/msg | {:.2} s |",
        args.messages,
        args.size,
        args.cache_bytes as f64 / f64::from(1u32 << 20),
        per(before, opened),
        per(opened, built),
        per(before, built),
        elapsed.as_secs_f64(),
    );
    broker.close().context("closing")?;
    Ok(())
}
