//! Code generated from keyward's own etcd-compatible protos (`proto/`), one module per protobuf package.
#![allow(clippy::all, missing_docs)]

pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}
pub mod authpb {
    tonic::include_proto!("authpb");
}
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}
