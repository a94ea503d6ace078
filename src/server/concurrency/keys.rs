//! The keys of a lock or an election: its holders' and candidates' keys all live under `name/`,
//! one per lease, named by the lease's id in hex (etcd's `fmt.Sprintf("%s%x", prefix, lease)`).

/// The prefix every key of `name` lives under.
pub(crate) fn prefix(name: &[u8]) -> Vec<u8> {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    prefix
}

/// The key under `prefix` that belongs to `lease`.
pub(crate) fn key_of_lease(prefix: &[u8], lease: i64) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(lease_hex(lease).as_bytes());
    key
}

/// Go's `%x` of a signed id: lowercase hex, a minus sign for a negative one.
fn lease_hex(lease: i64) -> String {
    if lease < 0 {
        format!("-{:x}", lease.unsigned_abs())
    } else {
        format!("{lease:x}")
    }
}

/// The end of the range of every key starting with `prefix` (etcd's `GetPrefixRangeEnd`): the prefix
/// with its last byte below 0xff incremented and what follows dropped; `\0` (to the end of the
/// keyspace) when every byte is 0xff.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|&byte| byte < 0xff) {
        Some(last) => {
            let mut end = prefix[..=last].to_vec();
            end[last] += 1;
            end
        }
        None => vec![0],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_named_as_etcd_names_them() {
        assert_eq!(key_of_lease(&prefix(b"mylock"), 0x694d8a5c0e1f2a03), b"mylock/694d8a5c0e1f2a03".to_vec());
        assert_eq!(key_of_lease(&prefix(b""), 255), b"/ff".to_vec());
        assert_eq!(key_of_lease(b"n/", -1), b"n/-1".to_vec());
        assert_eq!(key_of_lease(b"n/", i64::MIN), b"n/-8000000000000000".to_vec());
    }

    #[test]
    fn prefix_ends_as_etcds() {
        assert_eq!(prefix_end(b"a/"), b"a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }
}
