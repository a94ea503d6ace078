// The least-privilege user the tests run as, set up by root before auth is enabled: the
// certificate user kube-apiserver (no password) with one role that may read and write the tests'
// keys (the prefix "/" and three single keys) and nothing else.
package testserver

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	// testsKeyPrefix holds every key the upstream tests write: their store's resource prefix is
	// "/pods/", and other tests use "/registry/", "/custom/prefix/" and "/somekey".
	testsKeyPrefix = "/"
	// compactRevKey is the key kube-apiserver's compactor writes (k8s.io/apiserver
	// pkg/storage/etcd3/compact.go): outside any --etcd-prefix, so a deployment grants it apart.
	compactRevKey = "compact_rev_key"
)

// testHelperKeys are the keys outside "/" the tests' helpers write themselves through the client:
// increaseRVFunc's "increaseRV" (store_test.go) and TestPrefixGetKeys' and TestPrefixStats' "key".
var testHelperKeys = []string{"increaseRV", "key"}

func grantKubeAPIServer(endpoints []string, certs *certificates) error {
	client, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: certs.rootTLS, DialTimeout: 10 * time.Second})
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	noPassword := &clientv3.UserAddOptions{NoPassword: true}
	steps := []struct {
		what string
		do   func() error
	}{
		{"add user root", func() error { _, err := client.UserAddWithOptions(ctx, "root", "", noPassword); return err }},
		{"grant root the root role", func() error { _, err := client.UserGrantRole(ctx, "root", "root"); return err }},
		{"add role", func() error { _, err := client.RoleAdd(ctx, kubeAPIServerUser); return err }},
		{"grant the tests' prefix", func() error {
			_, err := client.RoleGrantPermission(ctx, kubeAPIServerUser, testsKeyPrefix, clientv3.GetPrefixRangeEnd(testsKeyPrefix), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		}},
		{"grant compact_rev_key", func() error {
			_, err := client.RoleGrantPermission(ctx, kubeAPIServerUser, compactRevKey, "", clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		}},
		{"grant the tests' helper keys", func() error {
			for _, key := range testHelperKeys {
				if _, err := client.RoleGrantPermission(ctx, kubeAPIServerUser, key, "", clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
					return err
				}
			}
			return nil
		}},
		{"add user", func() error { _, err := client.UserAddWithOptions(ctx, kubeAPIServerUser, "", noPassword); return err }},
		{"grant the user its role", func() error { _, err := client.UserGrantRole(ctx, kubeAPIServerUser, kubeAPIServerUser); return err }},
		{"enable auth", func() error { _, err := client.AuthEnable(ctx); return err }},
	}
	for _, step := range steps {
		if err := step.do(); err != nil {
			return fmt.Errorf("testserver: as root, %s: %w", step.what, err)
		}
	}
	return nil
}
