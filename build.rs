//! Compiles `proto/` into Rust types and tonic services with cargo alone:
//! `protox` parses the protos (no system `protoc`), `tonic-prost-build`
//! generates the code, and the encoded descriptor set is written next to it
//! for gRPC server reflection.

use std::path::PathBuf;

/// The output of `git ARGS` in the package's directory, if git answers.
fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// `LETTERBOX_COMMIT`, the commit the binary is built from (the metric
/// `letterbox_build_info`): the variable of that name when set (a build
/// outside the repository), else git's HEAD, else `unknown`. The script
/// runs again when HEAD moves.
fn commit() {
    println!("cargo:rerun-if-env-changed=LETTERBOX_COMMIT");
    let commit = std::env::var("LETTERBOX_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=LETTERBOX_COMMIT={commit}");
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        // A path that does not exist would run the script at every build.
        if let Some(path) = git(&["rev-parse", "--git-path", &name])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=build.rs");
    commit();
    let fds = protox::compile(["letterbox/v1/letterbox.proto"], ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("letterbox_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .bytes(".letterbox.v1")
        .compile_fds(fds)?;
    Ok(())
}
