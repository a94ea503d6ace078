//! Code generated from keyward's own etcd-compatible protos (`proto/`), one module per protobuf package,
//! with their proto3 JSON mapping (pbjson's serde impls, used by the HTTP/JSON gateway), and serde adapters that carry a protobuf message as its encoding (raft entries and apply results).
#![allow(clippy::all, missing_docs)]

pub mod mvccpb {
    tonic::include_proto!("mvccpb");
    include!(concat!(env!("OUT_DIR"), "/mvccpb.serde.rs"));
}
pub mod authpb {
    tonic::include_proto!("authpb");
    include!(concat!(env!("OUT_DIR"), "/authpb.serde.rs"));
}
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.serde.rs"));
}
/// etcd's Lock service (`proto/v3lockpb/v3lock.proto`).
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
    include!(concat!(env!("OUT_DIR"), "/v3lockpb.serde.rs"));
}
/// etcd's Election service (`proto/v3electionpb/v3election.proto`).
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
    include!(concat!(env!("OUT_DIR"), "/v3electionpb.serde.rs"));
}
/// keyward's member-to-member protocol (`proto/keywardpb/peer.proto`).
pub mod keywardpb {
    tonic::include_proto!("keywardpb");
}

/// serde for protobuf messages: their protobuf encoding as a byte string.
pub mod as_bytes {
    use prost::Message;
    use serde::de::Error;
    use serde::{Deserializer, Serializer};

    pub fn serialize<M: Message, S: Serializer>(m: &M, s: S) -> Result<S::Ok, S::Error> {
        serde_bytes::serialize(&m.encode_to_vec(), s)
    }

    pub fn deserialize<'de, M: Message + Default, D: Deserializer<'de>>(d: D) -> Result<M, D::Error> {
        let bytes: serde_bytes::ByteBuf = serde_bytes::deserialize(d)?;
        M::decode(bytes.as_slice()).map_err(D::Error::custom)
    }
}

/// serde for an optional protobuf message.
pub mod option_as_bytes {
    use prost::Message;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<M: Message, S: Serializer>(m: &Option<M>, s: S) -> Result<S::Ok, S::Error> {
        m.as_ref().map(|m| serde_bytes::ByteBuf::from(m.encode_to_vec())).serialize(s)
    }

    pub fn deserialize<'de, M: Message + Default, D: Deserializer<'de>>(d: D) -> Result<Option<M>, D::Error> {
        Option::<serde_bytes::ByteBuf>::deserialize(d)?
            .map(|b| M::decode(b.as_slice()).map_err(serde::de::Error::custom))
            .transpose()
    }
}
