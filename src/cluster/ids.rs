//! Member and cluster ids, derived from the same inputs on every member (as etcd derives them): a
//! member's id from its peer URLs and the cluster token, the cluster's id from its initial members' ids
//! and the token. Members started from the same `--initial-cluster` and `--initial-cluster-token` agree
//! on every id without talking; a member started with another token or other URLs gets another
//! cluster id, and its peers refuse it.

/// A stable 64-bit id from strings (FNV-1a), never 0 (etcd reserves 0 for "no member").
fn stable_id<'a>(parts: impl IntoIterator<Item = &'a str>) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.as_bytes().iter().chain(b"\0") {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash.max(1)
}

/// A member's id: its peer URLs (in any order) and the cluster token.
pub(crate) fn member_id(peer_urls: &[String], token: &str) -> u64 {
    let mut urls: Vec<&str> = peer_urls.iter().map(String::as_str).collect();
    urls.sort_unstable();
    stable_id(urls.into_iter().chain([token]))
}

/// The cluster's id: its initial members' ids (in any order) and the cluster token.
pub(crate) fn cluster_id(member_ids: &[u64], token: &str) -> u64 {
    let mut ids = member_ids.to_vec();
    ids.sort_unstable();
    let hex: Vec<String> = ids.iter().map(|id| format!("{id:x}")).collect();
    stable_id(hex.iter().map(String::as_str).chain([token]))
}

/// A member added at runtime (MemberAdd): its peer URLs, the token and the time in seconds, as etcd's
/// `NewMember` — adding the same URLs again a second later gives a new id (and within the same second,
/// etcd's "member ID already exist").
pub(crate) fn added_member_id(peer_urls: &[String], token: &str, unix_seconds: u64) -> u64 {
    let mut urls: Vec<&str> = peer_urls.iter().map(String::as_str).collect();
    urls.sort_unstable();
    let now = unix_seconds.to_string();
    stable_id(urls.into_iter().chain([token, now.as_str()]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_do_not_depend_on_order_but_on_every_input() {
        let a = vec!["http://10.0.0.1:2380".to_string(), "http://10.0.0.2:2380".to_string()];
        let b: Vec<String> = a.iter().rev().cloned().collect();
        assert_eq!(member_id(&a, "t"), member_id(&b, "t"));
        assert_ne!(member_id(&a, "t"), member_id(&a, "u"));
        assert_eq!(cluster_id(&[1, 2, 3], "t"), cluster_id(&[3, 1, 2], "t"));
        assert_ne!(cluster_id(&[1, 2, 3], "t"), cluster_id(&[1, 2, 4], "t"));
        assert_ne!(cluster_id(&[1, 2, 3], "t"), cluster_id(&[1, 2, 3], "u"));
        assert_ne!(added_member_id(&a, "t", 1), added_member_id(&a, "t", 2));
        assert_eq!(added_member_id(&a, "t", 1), added_member_id(&b, "t", 1));
    }

    /// Data dirs created before clusters had more than one member keep their ids.
    #[test]
    fn a_single_members_ids_are_those_it_had_before() {
        let urls = vec!["http://127.0.0.1:2380".to_string()];
        let member = stable_id(["http://127.0.0.1:2380", "etcd-cluster"]);
        assert_eq!(member_id(&urls, "etcd-cluster"), member);
        assert_eq!(cluster_id(&[member], "etcd-cluster"), stable_id([format!("{member:x}").as_str(), "etcd-cluster"]));
    }
}
