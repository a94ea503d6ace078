//! Requests that carry a forwarded client certificate (`keyward-forwarded-client-cert`), as a proxy
//! sends them: used by the member-side tests (`tls.rs`) and the proxy tests (`proxy.rs`).

use keyward::proto::etcdserverpb::kv_client::KvClient;
use keyward::proto::etcdserverpb::PutRequest;
use rustls_pki_types::pem::PemObject;

use super::pki::Cert;

pub(crate) const FORWARDED_CERT: &str = "keyward-forwarded-client-cert";
pub(crate) const NOT_TRUSTED_PROXY: &str = "peer is not a trusted proxy";

/// `cert`'s leaf as a proxy forwards it: DER, standard base64.
pub(crate) fn forwarded(cert: &Cert) -> String {
    use base64::Engine as _;
    let der = rustls_pki_types::CertificateDer::from_pem_file(&cert.cert).unwrap();
    base64::engine::general_purpose::STANDARD.encode(der)
}

/// Puts `key`, sending `forward` as `keyward-forwarded-client-cert` if given.
pub(crate) async fn put(
    kv: &mut KvClient<tonic::transport::Channel>,
    key: &str,
    forward: Option<&str>,
) -> Result<(), tonic::Status> {
    let mut request = tonic::Request::new(PutRequest { key: key.into(), value: b"v".to_vec(), ..Default::default() });
    if let Some(cert) = forward {
        request.metadata_mut().insert(FORWARDED_CERT, cert.parse().unwrap());
    }
    kv.put(request).await.map(drop)
}

#[track_caller]
pub(crate) fn assert_denied(result: Result<(), tonic::Status>, message: &str, what: &str) {
    match result {
        Err(status) => assert!(
            status.code() == tonic::Code::PermissionDenied && status.message().contains(message),
            "{what}: expected PermissionDenied with {message:?}, got {status:?}"
        ),
        Ok(()) => panic!("{what}: succeeded, expected PermissionDenied with {message:?}"),
    }
}
