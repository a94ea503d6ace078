// A cluster of server processes on free 127.0.0.1 ports: started with etcd's flags (client and
// peer mTLS), waited for until every member answers and a leader is elected, given the
// kube-apiserver user, and killed when the test ends.
package testserver

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

type cluster struct {
	endpoints    []string
	certificates *certificates
}

// member is one server process and where it logs.
type member struct {
	name, clientURL, peerURL, logFile string
	process                           *exec.Cmd
	// exited is closed once the process has ended (a flag it refused, a crash, the cleanup's kill).
	exited chan struct{}
}

// portLock keeps this process's clusters from picking the same free ports between choosing them
// and binding them (as upstream's autoPortLock).
var portLock sync.Mutex

// startCluster runs the deployment's members and returns once the kube-apiserver user can use them.
func startCluster(t testing.TB, d deployment, settings serverSettings) *cluster {
	t.Helper()
	dir := t.TempDir()
	certs, err := newCertificates(dir)
	if err != nil {
		t.Fatal(err)
	}

	portLock.Lock()
	members, err := launchMembers(t, d, settings, certs, dir)
	if err == nil {
		err = waitReady(members, certs)
	}
	portLock.Unlock()
	if err != nil {
		dumpLogs(t, members)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, members)
		}
	})

	c := &cluster{certificates: certs}
	for _, m := range members {
		c.endpoints = append(c.endpoints, m.clientURL)
	}
	if err := grantKubeAPIServer(c.endpoints, certs); err != nil {
		dumpLogs(t, members)
		t.Fatal(err)
	}
	return c
}

func launchMembers(t testing.TB, d deployment, settings serverSettings, certs *certificates, dir string) ([]*member, error) {
	ports, err := freePorts(2 * d.members)
	if err != nil {
		return nil, err
	}
	members := make([]*member, d.members)
	var initialCluster []string
	for i := range members {
		m := &member{
			name:      fmt.Sprintf("m%d", i),
			clientURL: fmt.Sprintf("https://127.0.0.1:%d", ports[2*i]),
			peerURL:   fmt.Sprintf("https://127.0.0.1:%d", ports[2*i+1]),
		}
		m.logFile = filepath.Join(dir, m.name+".log")
		members[i] = m
		initialCluster = append(initialCluster, m.name+"="+m.peerURL)
	}
	for _, m := range members {
		args := []string{
			"--name", m.name,
			"--data-dir", filepath.Join(dir, m.name+".data"),
			"--listen-client-urls", m.clientURL,
			"--advertise-client-urls", m.clientURL,
			"--listen-peer-urls", m.peerURL,
			"--initial-advertise-peer-urls", m.peerURL,
			"--initial-cluster", strings.Join(initialCluster, ","),
			"--initial-cluster-state", "new",
			"--initial-cluster-token", "kubernetes-tests",
			"--cert-file", certs.serverCertFile,
			"--key-file", certs.serverKeyFile,
			"--trusted-ca-file", certs.caFile,
			"--client-cert-auth",
			"--peer-cert-file", certs.serverCertFile,
			"--peer-key-file", certs.serverKeyFile,
			"--peer-trusted-ca-file", certs.caFile,
			"--peer-client-cert-auth",
		}
		if settings.watchProgressNotifyInterval > 0 {
			// etcd 3.4's spelling; 3.5 and later also take it.
			args = append(args, "--experimental-watch-progress-notify-interval", settings.watchProgressNotifyInterval.String())
		}
		if d.server == "keyward" {
			args = append([]string{"serve"}, args...)
		}
		log, err := os.Create(m.logFile)
		if err != nil {
			return members, err
		}
		m.process = exec.Command(d.binary, args...)
		m.process.Stdout, m.process.Stderr = log, log
		// The server dies with the test binary even if the binary is killed before its cleanups run.
		m.process.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := m.process.Start(); err != nil {
			_ = log.Close()
			return members, fmt.Errorf("testserver: start %s: %w", d.binary, err)
		}
		m.exited = make(chan struct{})
		go func(m *member) {
			_ = m.process.Wait()
			_ = log.Close()
			close(m.exited)
		}(m)
		t.Cleanup(func() {
			_ = m.process.Process.Kill()
			<-m.exited
		})
	}
	return members, nil
}

// freePorts returns ports that were free a moment ago (all chosen before any is released, so
// they differ).
func freePorts(count int) ([]int, error) {
	var ports []int
	for i := 0; i < count; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("testserver: no free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitReady waits until every member answers Status as root and one of them is leader.
func waitReady(members []*member, certs *certificates) error {
	deadline := time.Now().Add(60 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		if last = allAnswerWithLeader(members, certs); last == nil {
			return nil
		}
		for _, m := range members {
			select {
			case <-m.exited:
				return fmt.Errorf("testserver: member %s exited: %v", m.name, m.process.ProcessState)
			default:
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("testserver: the cluster was not ready in 60s: %w", last)
}

func allAnswerWithLeader(members []*member, certs *certificates) error {
	var endpoints []string
	for _, m := range members {
		endpoints = append(endpoints, m.clientURL)
	}
	client, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: certs.rootTLS, DialTimeout: 2 * time.Second})
	if err != nil {
		return err
	}
	defer client.Close()
	for _, endpoint := range endpoints {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		status, err := client.Status(ctx, endpoint)
		cancel()
		if err != nil {
			return err
		}
		if status.Leader == 0 {
			return fmt.Errorf("testserver: %s has no leader", endpoint)
		}
	}
	return nil
}

func dumpLogs(t testing.TB, members []*member) {
	for _, m := range members {
		if m == nil {
			continue
		}
		out, err := os.ReadFile(m.logFile)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		t.Logf("last lines of member %s's log:\n%s", m.name, strings.Join(lines, "\n"))
	}
}
