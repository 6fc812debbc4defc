//! The README's "Five minutes with a dead letter queue": its example
//! program, run against a fresh server, prints exactly the README's output
//! block. Only the message id differs from run to run; the README says so.

use crate::harness::TestServer;

// The example's own code; only its `main` (which reads the URL from the
// command line and passes standard output) is not called here.
#[allow(dead_code)]
#[path = "../../examples/walkthrough.rs"]
mod example;

/// The lines of the README's output block of the walkthrough: the first
/// `text` block after the command that runs the example.
fn readme_block() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    let readme = std::fs::read_to_string(path).unwrap();
    let section = readme
        .split("## Five minutes with a dead letter queue")
        .nth(1)
        .expect("the README has the walkthrough section");
    let after_command = section
        .split("cargo run --release --example walkthrough\n```\n")
        .nth(1)
        .expect("the section shows the command that runs the example");
    let block = after_command
        .strip_prefix("\n```text\n")
        .expect("the output block follows the command")
        .split("```")
        .next()
        .unwrap();
    block.lines().map(str::to_string).collect()
}

/// The message id on the `published ID` line.
fn published_id(lines: &[String]) -> String {
    lines
        .iter()
        .find_map(|l| l.strip_prefix("published "))
        .expect("a `published` line")
        .to_string()
}

#[tokio::test]
async fn the_walkthrough_prints_what_the_readme_shows() {
    let server = TestServer::start().await;
    let mut out = Vec::new();
    example::run(&format!("http://{}", server.addr), &mut out)
        .await
        .unwrap();
    let printed: Vec<String> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();

    let readme = readme_block();
    let (shown_id, id) = (published_id(&readme), published_id(&printed));
    assert_eq!(id.len(), shown_id.len(), "ids of the same form: {id}");
    let expected: Vec<String> = readme.iter().map(|l| l.replace(&shown_id, &id)).collect();
    assert_eq!(
        printed, expected,
        "the walkthrough's output differs from the README's (README id {shown_id} taken as {id})"
    );
}
