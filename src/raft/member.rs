//! What the raft membership says about each member: its peer URLs (where raft and forwarded requests
//! reach it), and, once it has started and published them, its name and client URLs (etcd's member
//! attributes, shown by MemberList).
//!
//! A member of `--initial-cluster` has its name from the start (etcd's `NewMember` takes it from the
//! flag), so `member list` names every initial member before it publishes; a member added with
//! MemberAdd is known by its peer URLs only until it starts, as in etcd (where `member list` shows it
//! `unstarted`).
//!
//! Stored inside openraft's membership (log entries, the applied state, snapshots). It is encoded as
//! one string — JSON — because data dirs written before members had attributes hold openraft's
//! `BasicNode`, a string of comma-separated peer URLs; both decode.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberNode {
    pub peer_urls: Vec<String>,
    /// `--initial-cluster`'s name for an initial member; for one added later, empty until it has
    /// started and published it.
    pub name: String,
    pub client_urls: Vec<String>,
}

impl MemberNode {
    pub fn unstarted(peer_urls: Vec<String>) -> Self {
        MemberNode { peer_urls, ..Default::default() }
    }

    /// A member named in `--initial-cluster`: its name is known before it starts.
    pub fn initial(name: String, peer_urls: Vec<String>) -> Self {
        MemberNode { peer_urls, name, client_urls: Vec::new() }
    }

    /// The URL this member's peers dial: the first peer URL (etcd tries each; keyward's transport
    /// uses the first and reports it unreachable otherwise).
    pub fn peer_url(&self) -> Option<&str> {
        self.peer_urls.first().map(String::as_str)
    }
}

impl std::fmt::Display for MemberNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.peer_urls.join(","))?;
        if !self.name.is_empty() {
            write!(f, " ({})", self.name)?;
        }
        Ok(())
    }
}

#[derive(Serialize, Deserialize)]
struct Encoded {
    peer_urls: Vec<String>,
    name: String,
    client_urls: Vec<String>,
}

impl Serialize for MemberNode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let encoded = Encoded {
            peer_urls: self.peer_urls.clone(),
            name: self.name.clone(),
            client_urls: self.client_urls.clone(),
        };
        serde_json::to_string(&encoded).map_err(serde::ser::Error::custom)?.serialize(s)
    }
}

impl<'de> Deserialize<'de> for MemberNode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text.starts_with('{') {
            let Encoded { peer_urls, name, client_urls } =
                serde_json::from_str(&text).map_err(serde::de::Error::custom)?;
            Ok(MemberNode { peer_urls, name, client_urls })
        } else {
            // openraft's BasicNode { addr }: the peer URLs joined by ','.
            Ok(MemberNode::unstarted(text.split(',').filter(|u| !u.is_empty()).map(str::to_string).collect()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_reads_the_basic_node_of_older_data_dirs() {
        let node = MemberNode {
            peer_urls: vec!["https://10.0.0.1:2380".into()],
            name: "n1".into(),
            client_urls: vec!["https://10.0.0.1:2379".into(), "http://127.0.0.1:2379".into()],
        };
        let bytes = postcard::to_allocvec(&node).unwrap();
        assert_eq!(postcard::from_bytes::<MemberNode>(&bytes).unwrap(), node);

        let old = postcard::to_allocvec(&openraft::BasicNode { addr: "http://127.0.0.1:2380".into() }).unwrap();
        assert_eq!(
            postcard::from_bytes::<MemberNode>(&old).unwrap(),
            MemberNode::unstarted(vec!["http://127.0.0.1:2380".into()])
        );
    }
}
