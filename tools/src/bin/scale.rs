//! `scale`: Letterbox at depth (fill, restart, drain, reclaim, many
//! queues). See `letterbox_tools::scale` and `tools/README.md`.

fn main() -> anyhow::Result<()> {
    letterbox_tools::scale::main()
}
