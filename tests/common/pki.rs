//! A test PKI generated with rcgen at run time into a temp dir (as `tests/tls.rs` builds its own): a
//! CA, a server certificate for 127.0.0.1/localhost, and client certificates on demand. No key is
//! ever committed.

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use tempfile::TempDir;

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct Cert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Cert {
    pub fn cert_str(&self) -> &str {
        self.cert.to_str().unwrap()
    }

    pub fn key_str(&self) -> &str {
        self.key.to_str().unwrap()
    }
}

/// A CA in its own temp dir (`ca.pem`) with a server certificate (`server.pem`).
pub struct Pki {
    pub dir: TempDir,
    issuer: Issuer<'static, KeyPair>,
    pub server: Cert,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::Builder::new().prefix("pki-").tempdir().expect("temp dir");
        let mut params = CertificateParams::default();
        params.distinguished_name = subject(Some("keyward test CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().expect("generate CA key");
        let cert = params.self_signed(&key).expect("self-sign CA");
        fs::write(dir.path().join("ca.pem"), cert.pem()).unwrap();
        let issuer = Issuer::new(params, key);
        let server = issue_into(dir.path(), &issuer, "server", server_params());
        Pki { dir, issuer, server }
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    pub fn ca_str(&self) -> String {
        self.ca_file().to_str().unwrap().to_string()
    }

    /// A client certificate (EKU clientAuth) with Common Name `cn` (or none), as `NAME.pem`.
    pub fn client(&self, name: &str, cn: Option<&str>) -> Cert {
        self.client_with_sans(name, cn, Vec::new())
    }

    /// A client certificate with Common Name `cn` (or none) and the given SANs.
    pub fn client_with_sans(&self, name: &str, cn: Option<&str>, sans: Vec<SanType>) -> Cert {
        let mut params = CertificateParams::default();
        params.distinguished_name = subject(cn);
        params.subject_alt_names = sans;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        issue_into(self.dir.path(), &self.issuer, name, params)
    }

    /// Issues a client certificate for `cn` and moves it over `target`'s files (certificate first,
    /// then key, each replaced atomically), as a mesh agent rotates a workload's certificate.
    pub fn rotate(&self, target: &Cert, cn: &str) {
        let fresh = self.client("rotated", Some(cn));
        fs::rename(&fresh.cert, &target.cert).unwrap();
        fs::rename(&fresh.key, &target.key).unwrap();
    }
}

/// A URI SAN (e.g. a SPIFFE ID).
pub fn uri_san(uri: &str) -> SanType {
    SanType::URI(uri.try_into().expect("an IA5 URI"))
}

fn subject(cn: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "keyward tests");
    if let Some(cn) = cn {
        dn.push(DnType::CommonName, cn);
    }
    dn
}

/// A server certificate for 127.0.0.1 and localhost, also usable as a client certificate.
fn server_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = subject(Some("keyward test server"));
    params.subject_alt_names =
        vec![SanType::IpAddress("127.0.0.1".parse().unwrap()), SanType::DnsName("localhost".try_into().unwrap())];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params
}

fn issue_into(dir: &Path, issuer: &Issuer<'static, KeyPair>, name: &str, mut params: CertificateParams) -> Cert {
    let mut serial: [u8; 16] = rand::random();
    serial[0] = (serial[0] & 0x3f) | 0x10;
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    let key = KeyPair::generate().expect("generate key");
    let cert = params.signed_by(&key, issuer).expect("sign certificate");
    let (cert_path, key_path) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}-key.pem")));
    fs::write(&cert_path, cert.pem()).unwrap();
    fs::write(&key_path, key.serialize_pem()).unwrap();
    Cert { cert: cert_path, key: key_path }
}
