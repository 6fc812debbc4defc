//! `chaos`: kill -9 and power-loss testing of Letterbox. See
//! `letterbox_tools::chaos` and RELIABILITY.md.

fn main() -> anyhow::Result<()> {
    letterbox_tools::chaos::main()
}
