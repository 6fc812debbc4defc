//! The proto as a public contract: a Python client generated from it runs
//! the core flow against this build's server, and `buf lint` (every element
//! documented) and `buf format` are clean. The scripts install what they
//! need (grpcio-tools from PyPI, buf from npm) under target/.

use std::process::Command;

fn run(script: &str) -> std::process::Output {
    Command::new("bash")
        .arg(script)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("LETTERBOX_BIN", env!("CARGO_BIN_EXE_letterbox"))
        .output()
        .expect("run script")
}

#[test]
fn a_generated_python_client_runs_the_core_flow() {
    let out = run("tests/python/run.sh");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "python client test failed:\n{text}");
    assert!(
        text.contains("PASS: core flow against a real server"),
        "{text}"
    );
}

#[test]
fn the_proto_passes_buf_lint_and_format() {
    let out = run("tests/buf/run.sh");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "buf failed:\n{text}");
    assert!(
        text.contains("lint: ok") && text.contains("format: ok"),
        "{text}"
    );
}
