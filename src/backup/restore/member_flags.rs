//! etcdutl's member flags of `snapshot restore` (keyward's `snapshot restore` and `migrate` take the
//! same), parsed into the new cluster's membership and this member's ids.
//!
//! The ids come from `cluster::bootstrap::new_cluster_of`, the function `keyward serve` bootstraps
//! with: each member restored with the same `--initial-cluster` and token agrees on every id without
//! talking, and `keyward serve` started with those flags finds the same ids stored.

use crate::cli::backup::MemberFlags;
use crate::cluster::bootstrap::{new_cluster_of, NewCluster};

/// The restored cluster: every member's id and peer URLs, this member's id and the cluster id.
pub(crate) fn new_cluster(flags: &MemberFlags) -> Result<NewCluster, String> {
    let members = initial_cluster(flags)?;
    Ok(new_cluster_of(&members, &flags.initial_advertise_peer_urls, &flags.initial_cluster_token))
}

/// `--initial-cluster` as `keyward serve` reads it: NAME=URL entries (a name may repeat, one URL
/// each), no URL twice, this member's `--name` present with exactly its advertised peer URLs.
fn initial_cluster(flags: &MemberFlags) -> Result<Vec<(String, Vec<String>)>, String> {
    let spec = flags.initial_cluster.clone().unwrap_or_else(|| {
        flags
            .initial_advertise_peer_urls
            .iter()
            .map(|url| format!("{}={url}", flags.name))
            .collect::<Vec<_>>()
            .join(",")
    });
    let mut members = Vec::<(String, Vec<String>)>::new();
    for entry in spec.split(',').filter(|e| !e.is_empty()) {
        let (name, url) =
            entry.split_once('=').ok_or_else(|| format!("--initial-cluster entry {entry:?} is not NAME=URL"))?;
        check_url(url).map_err(|e| format!("--initial-cluster: {e}"))?;
        if members.iter().flat_map(|(_, urls)| urls).any(|u| u == url) {
            return Err(format!("--initial-cluster has duplicate url {url}"));
        }
        match members.iter_mut().find(|(n, _)| n == name) {
            Some((_, urls)) => urls.push(url.to_string()),
            None => members.push((name.to_string(), vec![url.to_string()])),
        }
    }
    for url in &flags.initial_advertise_peer_urls {
        check_url(url).map_err(|e| format!("--initial-advertise-peer-urls: {e}"))?;
    }
    let Some((_, own)) = members.iter().find(|(n, _)| n == &flags.name) else {
        return Err(format!("--initial-cluster has no member named {:?} (this member's --name)", flags.name));
    };
    let (mut own, mut advertised) = (own.clone(), flags.initial_advertise_peer_urls.clone());
    own.sort();
    advertised.sort();
    if own != advertised {
        return Err(format!(
            "--initial-cluster has {}={} but --initial-advertise-peer-urls is {}",
            flags.name,
            own.join(","),
            flags.initial_advertise_peer_urls.join(",")
        ));
    }
    Ok(members)
}

fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("URL {url:?} must start with http:// or https://"))?;
    match rest.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(format!("URL {url:?} is not scheme://host:port")),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::cluster::ids;

    fn flags(name: &str, cluster: Option<&str>, peer: &str) -> MemberFlags {
        MemberFlags {
            data_dir: None,
            name: name.into(),
            initial_cluster: cluster.map(str::to_string),
            initial_cluster_token: "tok".into(),
            initial_advertise_peer_urls: vec![peer.into()],
        }
    }

    #[test]
    fn every_member_of_a_restored_cluster_agrees_on_the_ids_serve_derives() {
        let spec = "a=http://127.0.0.1:1,b=http://127.0.0.1:2,c=http://127.0.0.1:3";
        let a = new_cluster(&flags("a", Some(spec), "http://127.0.0.1:1")).unwrap();
        let c = new_cluster(&flags("c", Some(spec), "http://127.0.0.1:3")).unwrap();
        assert_eq!(a.cluster_id, c.cluster_id);
        assert_eq!(a.members.keys().collect::<Vec<_>>(), c.members.keys().collect::<Vec<_>>());
        assert_eq!(a.member_id, ids::member_id(&["http://127.0.0.1:1".to_string()], "tok"));
        assert_ne!(a.member_id, c.member_id);
        assert_eq!(flags("a", None, "http://127.0.0.1:1").data_dir(), PathBuf::from("a.keyward"));
    }

    #[test]
    fn inconsistent_member_flags_are_refused_naming_the_flag() {
        let err = new_cluster(&flags("x", Some("a=http://127.0.0.1:1"), "http://127.0.0.1:1")).err().unwrap();
        assert!(err.contains("no member named \"x\""), "{err}");
        let err = new_cluster(&flags("a", Some("a=http://127.0.0.1:1"), "http://127.0.0.1:9")).err().unwrap();
        assert!(err.contains("--initial-advertise-peer-urls"), "{err}");
        let err = new_cluster(&flags("a", Some("a=127.0.0.1:1"), "http://127.0.0.1:1")).err().unwrap();
        assert!(err.contains("--initial-cluster"), "{err}");
        let err = new_cluster(&flags("a", Some("a=http://h:1,b=http://h:1"), "http://h:1")).err().unwrap();
        assert!(err.contains("duplicate"), "{err}");
    }
}
