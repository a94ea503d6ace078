//! One member endpoint from `--endpoints`, parsed once: where to connect and whether over TLS.
//!
//! The forms etcd's client takes: `https://host:port`, `http://host:port`, or a bare `host:port`, which
//! is TLS when the proxy has a client TLS flag (`--cacert`, `--cert`, `--key`) and plain text otherwise.

use rustls_pki_types::ServerName;

/// A member's client URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// As given, for logs and errors.
    pub url: String,
    /// Host name or IP address, without brackets.
    pub host: String,
    pub port: u16,
    pub tls: bool,
}

impl Endpoint {
    /// Parses one `--endpoints` entry; `tls_by_default` decides a bare `host:port`.
    pub fn parse(text: &str, tls_by_default: bool) -> Result<Endpoint, String> {
        let (tls, host_port) = match text.split_once("://") {
            Some(("https", rest)) => (true, rest),
            Some(("http", rest)) => (false, rest),
            Some((scheme, _)) => {
                return Err(format!("--endpoints {text:?}: scheme {scheme:?} is not supported (want http or https)"))
            }
            None => (tls_by_default, text),
        };
        let host_port = host_port.trim_end_matches('/');
        let (host, port) = host_port
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
            .ok_or_else(|| format!("--endpoints {text:?} must be host:port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || host.contains('/') {
            return Err(format!("--endpoints {text:?} must be host:port"));
        }
        let endpoint = Endpoint { url: text.to_string(), host: host.to_string(), port, tls };
        if tls {
            endpoint.server_name()?;
        }
        Ok(endpoint)
    }

    /// The name the member's certificate must carry: its IP address or DNS name.
    pub fn server_name(&self) -> Result<ServerName<'static>, String> {
        ServerName::try_from(self.host.clone())
            .map_err(|e| format!("--endpoints {:?}: {:?} is not a valid server name: {e}", self.url, self.host))
    }

    /// The `scheme://host:port` requests to this member carry.
    pub fn authority_uri(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        if self.host.contains(':') {
            format!("{scheme}://[{}]:{}", self.host, self.port)
        } else {
            format!("{scheme}://{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_take_etcds_forms() {
        let tls = Endpoint::parse("https://127.0.0.1:2379", false).unwrap();
        assert_eq!((tls.host.as_str(), tls.port, tls.tls), ("127.0.0.1", 2379, true));
        let plain = Endpoint::parse("http://localhost:2379/", true).unwrap();
        assert_eq!((plain.host.as_str(), plain.port, plain.tls), ("localhost", 2379, false));
        assert!(Endpoint::parse("127.0.0.1:2379", true).unwrap().tls);
        assert!(!Endpoint::parse("127.0.0.1:2379", false).unwrap().tls);
        let v6 = Endpoint::parse("https://[::1]:2379", false).unwrap();
        assert_eq!(v6.host, "::1");
        assert_eq!(v6.authority_uri(), "https://[::1]:2379");
    }

    #[test]
    fn malformed_endpoints_are_refused() {
        assert!(Endpoint::parse("unix:///tmp/sock", false).unwrap_err().contains("not supported"));
        assert!(Endpoint::parse("127.0.0.1", false).unwrap_err().contains("host:port"));
        assert!(Endpoint::parse("http://:2379", false).unwrap_err().contains("host:port"));
        assert!(Endpoint::parse("http://h:99999", false).unwrap_err().contains("host:port"));
    }
}
