// The cluster's certificates, made fresh for each cluster: a CA, one server certificate every
// member uses for clients and peers, and two client certificates whose CNs are the users root (the
// harness's setup) and kube-apiserver (the tests' client).
package testserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// kubeAPIServerUser is the CN of the tests' client certificate, and so its user name.
const kubeAPIServerUser = "kube-apiserver"

type certificates struct {
	caFile, serverCertFile, serverKeyFile string
	rootTLS, kubeAPIServerTLS             *tls.Config
}

// newCertificates writes the CA and the server's pair under dir and keeps the clients' in memory.
func newCertificates(dir string) (*certificates, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "keyward kubernetes-tests CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)

	c := &certificates{
		caFile:         filepath.Join(dir, "ca.pem"),
		serverCertFile: filepath.Join(dir, "server.pem"),
		serverKeyFile:  filepath.Join(dir, "server-key.pem"),
	}
	if err := writePEM(c.caFile, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	// Members present it to clients and to each other, so it is good for both ends.
	serverDER, serverKey, err := issue(ca, caKey, 2, "keyward-member", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth})
	if err != nil {
		return nil, err
	}
	if err := writePEM(c.serverCertFile, "CERTIFICATE", serverDER); err != nil {
		return nil, err
	}
	if err := writePEM(c.serverKeyFile, "PRIVATE KEY", serverKey); err != nil {
		return nil, err
	}
	if c.rootTLS, err = clientTLS(ca, caKey, 3, "root", pool); err != nil {
		return nil, err
	}
	if c.kubeAPIServerTLS, err = clientTLS(ca, caKey, 4, kubeAPIServerUser, pool); err != nil {
		return nil, err
	}
	return c, nil
}

// issue signs a certificate for 127.0.0.1 and localhost and returns it and its PKCS#8 key, DER.
func issue(ca *x509.Certificate, caKey *ecdsa.PrivateKey, serial int64, cn string, usage []x509.ExtKeyUsage) ([]byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return der, keyDER, nil
}

func clientTLS(ca *x509.Certificate, caKey *ecdsa.PrivateKey, serial int64, cn string, pool *x509.CertPool) (*tls.Config, error) {
	der, keyDER, err := issue(ca, caKey, serial, cn, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth})
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool}, nil
}

func writePEM(path, blockType string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), 0o600)
}
