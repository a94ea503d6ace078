//! Compiles keyward's own etcd-compatible protos with protox (pure Rust), so a build needs no `protoc`,
//! and generates their proto3 JSON mapping (pbjson) for the HTTP/JSON gateway.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/mvccpb/kv.proto",
        "proto/authpb/auth.proto",
        "proto/etcdserverpb/rpc.proto",
        "proto/etcdserverpb/raft_internal.proto",
        "proto/keywardpb/peer.proto",
        "proto/v3lockpb/v3lock.proto",
        "proto/v3electionpb/v3election.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    // The raft log's own messages never travel as JSON: no serde code for them.
    let internal: Vec<String> = fds
        .file
        .iter()
        .filter(|file| file.name() == "etcdserverpb/raft_internal.proto")
        .flat_map(|file| file.message_type.iter().map(|m| format!(".etcdserverpb.{}", m.name())))
        .collect();
    let encoded = fds.encode_to_vec();
    // A raft request is one of some thirty kinds; boxed, it is a few hundred bytes instead of over a
    // thousand, and so is every future and channel slot that carries one on the write path.
    let mut config = tonic_prost_build::configure().build_client(true).generate_default_stubs(true);
    for field in raft_request_kinds(&fds) {
        config = config.boxed(field);
    }
    config.compile_fds(fds)?;
    // etcd's gateway marshals with grpc-gateway's default `JSONPb{OrigName: true}`: field names as
    // written in the .proto, 64-bit integers as strings, bytes as base64, defaults omitted; it ignores
    // unknown fields in requests.
    pbjson_build::Builder::new()
        .register_descriptors(&encoded)?
        .preserve_proto_field_names()
        .ignore_unknown_fields()
        .exclude(internal)
        .build(&[".etcdserverpb", ".mvccpb", ".authpb", ".v3lockpb", ".v3electionpb"])?;
    Ok(())
}

/// The request fields of `InternalRaftRequest` (every message-typed field but its header).
fn raft_request_kinds(fds: &prost_types::FileDescriptorSet) -> Vec<String> {
    use prost_types::field_descriptor_proto::Type;
    fds.file
        .iter()
        .flat_map(|file| file.message_type.iter())
        .filter(|message| message.name() == "InternalRaftRequest")
        .flat_map(|message| message.field.iter())
        .filter(|field| field.r#type() == Type::Message && field.name() != "header")
        .map(|field| format!(".etcdserverpb.InternalRaftRequest.{}", field.name()))
        .collect()
}
