//! Generates the kubelet gRPC code with a vendored protoc, so builds need nothing installed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment here.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure().compile_protos(
        &[
            "proto/deviceplugin.proto",
            "proto/podresources.proto",
            "proto/dra.proto",
            "proto/drahealth.proto",
            "proto/pluginregistration.proto",
        ],
        &["proto"],
    )?;
    Ok(())
}
