//! A test PKI generated with rcgen at run time (no key is ever committed): a CA, server and client
//! certificates as PEM files in a temp dir, certificates of a foreign CA, and CRLs. Used (as `common::pki`)
//! by `tls.rs`, the cluster tests (peer mTLS) and the proxy tests.

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, RevocationReason, RevokedCertParams,
    SanType, SerialNumber,
};
use tempfile::TempDir;

/// A certificate authority that can sign leaves and CRLs.
pub(crate) struct Ca {
    pub issuer: Issuer<'static, KeyPair>,
    pub pem: String,
}

impl Ca {
    pub(crate) fn new(name: &str) -> Ca {
        let mut params = CertificateParams::default();
        params.distinguished_name = subject(Some(name));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().expect("generate CA key");
        let cert = params.self_signed(&key).expect("self-sign CA");
        Ca { pem: cert.pem(), issuer: Issuer::new(params, key) }
    }
}

/// A subject with an organization and, optionally, a Common Name.
pub(crate) fn subject(cn: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "keyward tests");
    if let Some(cn) = cn {
        dn.push(DnType::CommonName, cn);
    }
    dn
}

/// A fresh positive 16-byte serial number (first byte non-zero, so its DER form is these bytes).
pub(crate) fn random_serial() -> Vec<u8> {
    let mut serial: [u8; 16] = rand::random();
    serial[0] = (serial[0] & 0x3f) | 0x10;
    serial.to_vec()
}

/// Parameters of a client certificate (EKU clientAuth) with the given CN (or none).
pub(crate) fn client_params(cn: Option<&str>) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = subject(cn);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params
}

/// Parameters of a server certificate for 127.0.0.1 / localhost (etcd also uses it as a client).
pub(crate) fn server_params(cn: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = subject(Some(cn));
    params.subject_alt_names =
        vec![SanType::IpAddress("127.0.0.1".parse().unwrap()), SanType::DnsName("localhost".try_into().unwrap())];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params
}

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub(crate) struct Cert {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub serial: Vec<u8>,
}

impl Cert {
    pub(crate) fn cert_str(&self) -> &str {
        self.cert.to_str().unwrap()
    }

    pub(crate) fn key_str(&self) -> &str {
        self.key.to_str().unwrap()
    }
}

/// A test's PKI in its own temp dir: `ca.pem`, a server certificate (`server.pem`) and client
/// certificates CN=root, CN=alice, CN=bob; more on demand.
pub(crate) struct Pki {
    pub dir: TempDir,
    pub ca: Ca,
    pub server: Cert,
    pub root: Cert,
    pub alice: Cert,
    pub bob: Cert,
}

impl Pki {
    pub(crate) fn new() -> Pki {
        let dir = tempfile::Builder::new().prefix("tls-pki-").tempdir().expect("temp dir");
        let ca = Ca::new("keyward test CA");
        fs::write(dir.path().join("ca.pem"), &ca.pem).unwrap();
        let issue = |name: &str, params| issue_into(dir.path(), &ca, name, params);
        let server = issue("server", server_params("keyward test server A"));
        let root = issue("root", client_params(Some("root")));
        let alice = issue("alice", client_params(Some("alice")));
        let bob = issue("bob", client_params(Some("bob")));
        Pki { dir, ca, server, root, alice, bob }
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub(crate) fn ca_file(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// A certificate signed by this PKI's CA, written as `NAME.pem` / `NAME-key.pem`.
    pub(crate) fn issue(&self, name: &str, params: CertificateParams) -> Cert {
        issue_into(self.dir.path(), &self.ca, name, params)
    }

    /// A certificate signed by another CA, written into this PKI's dir.
    pub(crate) fn issue_by(&self, ca: &Ca, name: &str, params: CertificateParams) -> Cert {
        issue_into(self.dir.path(), ca, name, params)
    }

    /// Writes (or atomically replaces) `crl.pem`: this CA's CRL number `number`, revoking `revoked`.
    pub(crate) fn crl(&self, number: u8, revoked: &[&Cert]) -> PathBuf {
        let params = CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2024, 1, 1),
            next_update: rcgen::date_time_ymd(2099, 1, 1),
            crl_number: SerialNumber::from_slice(&[number]),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|c| RevokedCertParams {
                    serial_number: SerialNumber::from_slice(&c.serial),
                    revocation_time: rcgen::date_time_ymd(2024, 1, 1),
                    reason_code: Some(RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        let crl = params.signed_by(&self.ca.issuer).expect("sign CRL");
        let path = self.path("crl.pem");
        replace_file(&path, crl.pem().unwrap().as_bytes());
        path
    }

    pub(crate) fn ca_str(&self) -> String {
        self.ca_file().to_str().unwrap().to_string()
    }

    /// A client certificate (EKU clientAuth) with Common Name `cn` (or none), as `NAME.pem`.
    pub(crate) fn client(&self, name: &str, cn: Option<&str>) -> Cert {
        self.client_with_sans(name, cn, Vec::new())
    }

    /// A client certificate with Common Name `cn` (or none) and the given SANs.
    pub(crate) fn client_with_sans(&self, name: &str, cn: Option<&str>, sans: Vec<SanType>) -> Cert {
        let mut params = client_params(cn);
        params.subject_alt_names = sans;
        self.issue(name, params)
    }

    /// Issues a client certificate for `cn` and moves it over `target`'s files (certificate first,
    /// then key, each replaced atomically), as a mesh agent rotates a workload's certificate.
    pub(crate) fn rotate(&self, target: &Cert, cn: &str) {
        let fresh = self.client("rotated", Some(cn));
        fs::rename(&fresh.cert, &target.cert).unwrap();
        fs::rename(&fresh.key, &target.key).unwrap();
    }
}

/// Signs `params` by `ca` with a fresh key (and a fresh serial unless the params carry one) and writes
/// `DIR/NAME.pem` and `DIR/NAME-key.pem`.
pub(crate) fn issue_into(dir: &Path, ca: &Ca, name: &str, mut params: CertificateParams) -> Cert {
    let serial = match &params.serial_number {
        Some(serial) => serial.to_bytes(),
        None => {
            let serial = random_serial();
            params.serial_number = Some(SerialNumber::from_slice(&serial));
            serial
        }
    };
    let key = KeyPair::generate().expect("generate key");
    let cert = params.signed_by(&key, &ca.issuer).expect("sign certificate");
    let cert_path = dir.join(format!("{name}.pem"));
    let key_path = dir.join(format!("{name}-key.pem"));
    fs::write(&cert_path, cert.pem()).unwrap();
    fs::write(&key_path, key.serialize_pem()).unwrap();
    Cert { cert: cert_path, key: key_path, serial }
}

/// Replaces `path` atomically: writes a temp file next to it, then renames it over `path`.
pub(crate) fn replace_file(path: &Path, contents: &[u8]) {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, contents).unwrap();
    fs::rename(&tmp, path).unwrap();
}

/// A URI SAN (e.g. a SPIFFE ID).
pub(crate) fn uri_san(uri: &str) -> SanType {
    SanType::URI(uri.try_into().expect("an IA5 URI"))
}
