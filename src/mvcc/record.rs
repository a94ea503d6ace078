//! The `kv_revs` record of one change: what a put wrote (or a deletion removed), stored compactly.
//!
//! Since layout 3 (`raft/state_machine/layout.rs`) a record is
//!
//! ```text
//! flags       1 byte: the tag (bit 0: a put, else a tombstone); 0x80: mod_revision is stored
//! key         varint length, then the key
//! create      varint of mod_revision − create_revision (0 for a key's first version)
//! version     varint
//! lease       varint (the lease id as u64)
//! [mod]       varint, only with flag 0x80: a change whose mod_revision is not its revision's main
//!             (never written by keyward itself; `keyward migrate` copies what it finds)
//! value       the rest
//! ```
//!
//! Every field of the `KeyValue` is kept, so the record of layout 2 (the tag, then the protobuf
//! `KeyValue`, [`legacy_change`]) is rebuilt exactly: `HashKV` and `Hash` hash that form, whatever the
//! layout. A 16-byte key with a 100-byte value takes 121 bytes (layout 2: 131).

use prost::encoding::{decode_varint, encode_varint};
use prost::Message;

use super::revision::Revision;
use crate::error::EtcdError;
use crate::proto::mvccpb::KeyValue;

/// A record that is not one: logged, and an internal error to the client (as `store.rs` does).
fn corrupt(what: &str) -> EtcdError {
    tracing::error!(what, "corrupt record in the kv store");
    EtcdError::Internal
}

/// The flag of a record that stores its mod_revision.
const EXPLICIT_MOD: u8 = 0x80;
/// The bits of the flags byte that are the tag.
const TAG_BITS: u8 = 0x01;

/// The record of `kv` changed at `at` with `tag`.
pub(crate) fn encode_change(at: Revision, tag: u8, kv: &KeyValue) -> Vec<u8> {
    let explicit = kv.mod_revision != at.main;
    let mut out = Vec::with_capacity(1 + 4 * 10 + kv.key.len() + kv.value.len());
    out.push(tag | if explicit { EXPLICIT_MOD } else { 0 });
    encode_varint(kv.key.len() as u64, &mut out);
    out.extend_from_slice(&kv.key);
    encode_varint(kv.mod_revision.wrapping_sub(kv.create_revision) as u64, &mut out);
    encode_varint(kv.version as u64, &mut out);
    encode_varint(kv.lease as u64, &mut out);
    if explicit {
        encode_varint(kv.mod_revision as u64, &mut out);
    }
    out.extend_from_slice(&kv.value);
    out
}

/// Splits the record of the change at `at` into its tag and key-value.
pub(crate) fn decode_change(at: Revision, bytes: &[u8]) -> Result<(u8, KeyValue), EtcdError> {
    let bad = || corrupt("change record");
    let (&flags, mut rest) = bytes.split_first().ok_or_else(bad)?;
    if flags & !(TAG_BITS | EXPLICIT_MOD) != 0 {
        return Err(bad());
    }
    let varint = |rest: &mut &[u8]| decode_varint(rest).map_err(|_| bad());
    let key_len = usize::try_from(varint(&mut rest)?).map_err(|_| bad())?;
    if rest.len() < key_len {
        return Err(bad());
    }
    let (key, mut rest) = rest.split_at(key_len);
    let back = varint(&mut rest)? as i64;
    let version = varint(&mut rest)? as i64;
    let lease = varint(&mut rest)? as i64;
    let mod_revision = if flags & EXPLICIT_MOD != 0 { varint(&mut rest)? as i64 } else { at.main };
    let kv = KeyValue {
        key: key.to_vec(),
        create_revision: mod_revision.wrapping_sub(back),
        mod_revision,
        version,
        value: rest.to_vec(),
        lease,
    };
    Ok((flags & TAG_BITS, kv))
}

/// Layout 2's record of the same change: the tag, then the protobuf `KeyValue`.
pub(crate) fn legacy_change(tag: u8, kv: &KeyValue) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + kv.encoded_len());
    out.push(tag);
    out.extend_from_slice(&kv.encode_to_vec());
    out
}

/// Reads layout 2's record.
pub(crate) fn decode_legacy_change(bytes: &[u8]) -> Result<(u8, KeyValue), EtcdError> {
    let (&tag, kv) = bytes.split_first().ok_or_else(|| corrupt("change record"))?;
    Ok((tag, KeyValue::decode(kv).map_err(|_| corrupt("key-value"))?))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Any key-value at any revision comes back as it was, and so does its legacy record.
        #[test]
        fn records_round_trip(
            key in prop::collection::vec(any::<u8>(), 0..40), value in prop::collection::vec(any::<u8>(), 0..40),
            main in any::<i64>(), create in any::<i64>(), version in any::<i64>(), lease in any::<i64>(),
            same_mod in any::<bool>(), other_mod in any::<i64>(), tag in 0u8..2,
        ) {
            let mod_revision = if same_mod { main } else { other_mod };
            let kv = KeyValue { key, create_revision: create, mod_revision, version, value, lease };
            let at = Revision::new(main, 3);
            prop_assert_eq!(decode_change(at, &encode_change(at, tag, &kv)).unwrap(), (tag, kv.clone()));
            prop_assert_eq!(decode_legacy_change(&legacy_change(tag, &kv)).unwrap(), (tag, kv));
        }
    }

    /// The record `benches/store-scale.sh` writes most: 121 bytes where layout 2 took 131.
    #[test]
    fn a_first_put_of_a_16_byte_key_and_100_byte_value_takes_121_bytes() {
        let at = Revision::new(1_000_000, 0);
        let kv = KeyValue {
            key: vec![b'k'; 16],
            create_revision: at.main,
            mod_revision: at.main,
            version: 1,
            value: vec![b'v'; 100],
            lease: 0,
        };
        assert_eq!(encode_change(at, 1, &kv).len(), 121);
        assert_eq!(legacy_change(1, &kv).len(), 131);
        assert!(decode_change(at, &[0x02, 0]).is_err(), "an unknown flag is corrupt, not misread");
        assert!(decode_change(at, &[0x01, 5, b'a']).is_err(), "a key longer than the record");
    }
}
