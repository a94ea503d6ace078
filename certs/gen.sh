#!/usr/bin/env bash
# Makes a development PKI for keyward in one command (openssl only):
#   ca.pem/ca-key.pem                 the client CA: client-port server certificates and client certificates
#   member{1..N}.pem/-key.pem         client-port server certificates (N: $KEYWARD_DEV_MEMBERS, default 3),
#                                     SANs 127.0.0.1, localhost, memberI (docker compose), and the names of
#                                     deploy/kubernetes in namespace default (*.keyward-peer.default.svc,
#                                     keyward.default.svc)
#   peer-ca.pem/peer-ca-key.pem       the peer CA: it signs only members' peer certificates, so no client or
#                                     proxy certificate is ever a member (--peer-trusted-ca-file)
#   peer{1..N}.pem/-key.pem           peer certificates (server+client auth, CN=memberI), SANs 127.0.0.1,
#                                     localhost, memberI, *.keyward-peer.default.svc
#   proxy.pem                         CN=keyward-proxy, server+client: the grpc-proxy's own certificate
#   root.pem, alice.pem, bob.pem      client certificates with CN=root, CN=alice, CN=bob
#   revoked.pem                       a client certificate (CN=mallory), revoked in crl.pem
#   crl.pem                           the CA's certificate revocation list
# Usage: certs/gen.sh [OUT_DIR]   (default: certs/dev). Never commit the keys it writes.
set -euo pipefail
out="${1:-$(dirname "$0")/dev}"
mkdir -p "$out"
cd "$out"
days=825
members="${KEYWARD_DEV_MEMBERS:-3}"
# openssl resolves ${ENV::...} when it reads the config, for every certificate: always set.
export SAN_NAME=localhost

cat > openssl.cnf <<'CNF'
[ ca ]
default_ca = dev_ca
[ dev_ca ]
dir = .
database = index.txt
new_certs_dir = .
serial = serial
crlnumber = crlnumber
default_md = sha256
default_crl_days = 365
policy = any
# The peer CA issues certificates with the same subjects (CN=memberI) as the client CA.
unique_subject = no
[ any ]
commonName = supplied
[ server_ext ]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = IP:127.0.0.1, DNS:localhost, DNS:${ENV::SAN_NAME}, DNS:*.keyward-peer.default.svc, DNS:keyward.default.svc
[ peer_ext ]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = IP:127.0.0.1, DNS:localhost, DNS:${ENV::SAN_NAME}, DNS:*.keyward-peer.default.svc
[ client_ext ]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
CNF
: > index.txt
echo 1000 > serial
echo 1000 > crlnumber

new_ca() { # file subject
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1-key.pem" -out "$1.pem" \
        -days "$days" -subj "/CN=$2" -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}
new_ca ca "keyward dev CA"
new_ca peer-ca "keyward dev peer CA"

issue() { # name cn extension [ca] (server_ext and peer_ext read SAN_NAME from the environment)
    local ca="${4:-ca}"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1-key.pem" -out "$1.csr" \
        -subj "/CN=$2" 2>/dev/null
    openssl ca -batch -config openssl.cnf -cert "$ca.pem" -keyfile "$ca-key.pem" -in "$1.csr" -out "$1.pem" \
        -days "$days" -extensions "$3" -notext 2>/dev/null
    rm -f "$1.csr"
}

for i in $(seq 1 "$members"); do
    SAN_NAME="member$i" issue "member$i" "member$i" server_ext
    SAN_NAME="member$i" issue "peer$i" "member$i" peer_ext peer-ca
done
SAN_NAME=keyward-proxy issue proxy keyward-proxy server_ext
for u in root alice bob; do issue "$u" "$u" client_ext; done
issue revoked mallory client_ext
openssl ca -config openssl.cnf -cert ca.pem -keyfile ca-key.pem -revoke revoked.pem 2>/dev/null
openssl ca -config openssl.cnf -cert ca.pem -keyfile ca-key.pem -gencrl -out crl.pem 2>/dev/null
rm -f index.txt* serial* crlnumber* openssl.cnf ./*.pem.old 1000.pem 100?.pem 2>/dev/null || true
chmod 600 ./*-key.pem
echo "development PKI written to $out"
