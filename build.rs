//! Compiles `proto/` into Rust types and tonic services with cargo alone:
//! `protox` parses the protos (no system `protoc`), `tonic-prost-build`
//! generates the code, and the encoded descriptor set is written next to it
//! for gRPC server reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
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
