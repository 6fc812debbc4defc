//! `loadgen`: side-by-side load generator for Letterbox and peer brokers.
//! See `letterbox_tools::loadgen` and `tools/README.md`.

fn main() -> anyhow::Result<()> {
    letterbox_tools::loadgen::main()
}
