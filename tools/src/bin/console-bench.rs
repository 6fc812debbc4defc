//! `console-bench`: what the web console costs (page times at 10,000
//! queues; publish throughput with the console off, on, and with a page
//! open). See `letterbox_tools::console_bench` and `tools/README.md`.

fn main() -> anyhow::Result<()> {
    letterbox_tools::console_bench::main()
}
