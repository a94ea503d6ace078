//! Whether a leader's process is gone: every one of its peer URLs refuses a TCP connection.
//!
//! A follower whose stream from the leader broke (`cluster/append_stream.rs`) asks this before it
//! waits out an election timeout (`election_timer.rs`). A refused connection is a definite answer:
//! the host is up and nothing listens on the port, which a live member's peer listener never lets
//! happen (a member whose accept queue is full drops the handshake, it does not refuse it). A
//! timeout, an unreachable host, a name that does not resolve or a connection that succeeds is no
//! answer: the leader may be partitioned, paused, restarting behind a slow network or alive, and
//! the election timeout decides as before.

use std::time::Duration;

use tokio::net::TcpStream;

/// Whether every address of every URL in `peer_urls` refused a connection within `patience`.
pub(crate) async fn is_gone(peer_urls: &[String], patience: Duration) -> bool {
    if peer_urls.is_empty() {
        return false;
    }
    for url in peer_urls {
        match tokio::time::timeout(patience, refuses(url)).await {
            Ok(true) => {}
            Ok(false) | Err(_) => return false,
        }
    }
    true
}

/// Whether every address `url`'s host resolves to refuses a connection to its port.
async fn refuses(url: &str) -> bool {
    let Some(authority) = authority(url) else { return false };
    let Ok(addrs) = tokio::net::lookup_host(authority).await else { return false };
    let mut any = false;
    for addr in addrs {
        any = true;
        match TcpStream::connect(addr).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
            _ => return false,
        }
    }
    any
}

/// `host:port` of a peer URL (`scheme://host:port[/path]`); `None` without an explicit port.
fn authority(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next()?;
    let (_, port) = authority.rsplit_once(':')?;
    (!port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())).then_some(authority)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authority_of_a_peer_url() {
        assert_eq!(authority("http://127.0.0.1:2380"), Some("127.0.0.1:2380"));
        assert_eq!(authority("https://m1.example:2380/"), Some("m1.example:2380"));
        assert_eq!(authority("https://[::1]:2380"), Some("[::1]:2380"));
        assert_eq!(authority("https://[::1]"), None);
        assert_eq!(authority("http://m1.example"), None);
    }

    #[tokio::test]
    async fn a_closed_port_is_gone_and_a_listening_one_is_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let listening = format!("http://{}", listener.local_addr().unwrap());
        let closed = {
            let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", socket.local_addr().unwrap())
        };
        let patience = Duration::from_secs(5);
        assert!(is_gone(std::slice::from_ref(&closed), patience).await);
        assert!(!is_gone(std::slice::from_ref(&listening), patience).await);
        // One URL that answers is enough to be alive.
        assert!(!is_gone(&[closed.clone(), listening], patience).await);
        assert!(!is_gone(&[], patience).await);
        assert!(!is_gone(&["http://no-such-host.invalid:2380".to_string()], patience).await);
    }
}
