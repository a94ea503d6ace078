//! Compiles keyward's own etcd-compatible protos with protox (pure Rust), so a build needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/mvccpb/kv.proto",
        "proto/authpb/auth.proto",
        "proto/etcdserverpb/rpc.proto",
        "proto/etcdserverpb/raft_internal.proto",
        "proto/keywardpb/peer.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().build_client(true).generate_default_stubs(true).compile_fds(fds)?;
    Ok(())
}
