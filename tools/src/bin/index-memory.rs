//! `index-memory`: heap held per queued message after a start, store and
//! engine indexes apart. See `letterbox_tools::memory` and
//! `tools/README.md`.

#[global_allocator]
static ALLOC: letterbox_tools::memory::Counting = letterbox_tools::memory::Counting;

fn main() -> anyhow::Result<()> {
    letterbox_tools::memory::main()
}
