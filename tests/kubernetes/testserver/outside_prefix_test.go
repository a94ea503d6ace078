package testserver

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// What kube-apiserver calls outside its key prefix works for the certificate user kube-apiserver,
// on keyward and on etcd alike (docs/kubernetes.md lists the calls), and the user is not root: a
// key outside its grants is refused.
func TestKubeAPIServerCallsOutsideItsPrefix(t *testing.T) {
	for _, server := range []string{"keyward", "etcd"} {
		t.Run(server, func(t *testing.T) {
			d := deployment{server: server, members: 1}
			switch server {
			case "keyward":
				d.binary = os.Getenv("KEYWARD_BIN")
			case "etcd":
				d.binary = envOr("ETCD_BIN", "/usr/bin/etcd")
			}
			if _, err := os.Stat(d.binary); d.binary == "" || err != nil {
				t.Skipf("no %s binary (KEYWARD_BIN / ETCD_BIN): %q", server, d.binary)
			}
			cluster := startCluster(t, d, serverSettings{})
			client, err := clientv3.New(clientv3.Config{Endpoints: cluster.endpoints, TLS: cluster.certificates.kubeAPIServerTLS, DialTimeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			status, err := client.Status(ctx, cluster.endpoints[0])
			if err != nil || status.Version == "" || status.DbSize == 0 {
				t.Fatalf("Status (version, DB size): %+v, %v", status, err)
			}
			if _, err := client.MemberList(ctx); err != nil {
				t.Fatalf("MemberList: %v", err)
			}
			if _, err := client.Get(ctx, "/registry/health"); err != nil {
				t.Fatalf("the health read: %v", err)
			}
			lease, err := client.Grant(ctx, 60)
			if err != nil {
				t.Fatalf("LeaseGrant: %v", err)
			}
			put, err := client.Put(ctx, "/registry/events/e1", "v", clientv3.WithLease(lease.ID))
			if err != nil {
				t.Fatalf("a put with the lease: %v", err)
			}
			// kube-apiserver's compactor (k8s.io/apiserver pkg/storage/etcd3/compact.go).
			txn, err := client.Txn(ctx).
				If(clientv3.Compare(clientv3.Version(compactRevKey), "=", 0)).
				Then(clientv3.OpPut(compactRevKey, "1")).
				Else(clientv3.OpGet(compactRevKey)).
				Commit()
			if err != nil || !txn.Succeeded {
				t.Fatalf("the txn on compact_rev_key: %+v, %v", txn, err)
			}
			if _, err := client.Compact(ctx, put.Header.Revision); err != nil {
				t.Fatalf("Compact: %v", err)
			}
			if _, err := client.Put(ctx, "outside", "v"); err == nil || !strings.Contains(err.Error(), "permission denied") {
				t.Fatalf("a put outside the grants must be refused, got %v", err)
			}
		})
	}
}
