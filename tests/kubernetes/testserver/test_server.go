// Package testserver is keyward's swap for k8s.io/apiserver's pkg/storage/etcd3/testserver: the same
// two functions the upstream storage tests call (NewTestConfig, RunEtcd), but RunEtcd starts a real
// server process (keyward, or etcd with SERVER=etcd) of one or three members (MEMBERS) on free
// 127.0.0.1 ports, as Kubernetes deploys it: client mTLS, auth enabled, and the client a certificate
// user (CN kube-apiserver) that may read and write the tests' keys only. run.sh puts these files in
// place of the upstream package with `go test -overlay`; the upstream test files run unchanged.
package testserver

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
)

// NewTestConfig returns the configuration the tests may adjust before RunEtcd. Only the fields
// serverSettingsFrom translates into server flags may be changed; RunEtcd fails the test on any other.
func NewTestConfig(t testing.TB) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	return cfg
}

// RunEtcd starts the server the environment names with cfg's settings (or the defaults if nil) and
// returns a client for the kube-apiserver user with every member's endpoint. The server is killed
// when the test ends.
func RunEtcd(t testing.TB, cfg *embed.Config) *kubernetes.Client {
	t.Helper()
	if cfg == nil {
		cfg = NewTestConfig(t)
	}
	settings, err := serverSettingsFrom(cfg)
	if err != nil {
		t.Fatal(err)
	}
	deployment, err := deploymentFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	cluster := startCluster(t, deployment, settings)

	client, err := kubernetes.New(clientv3.Config{
		TLS:         cluster.certificates.kubeAPIServerTLS,
		Endpoints:   cluster.endpoints,
		DialTimeout: 10 * time.Second,
		Logger:      zaptest.NewLogger(t, zaptest.Level(zapcore.ErrorLevel)).Named("etcd-client"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	// As upstream: the tests count the requests the store makes through these recorders.
	kubernetesRecorder := storagetesting.NewKubernetesRecorder(client.Kubernetes)
	client.KV = storagetesting.NewKVRecorder(client.KV, kubernetesRecorder)
	client.Kubernetes = kubernetesRecorder
	return client
}
