// Which server and how many members, from the environment run.sh sets: SERVER (keyward or etcd),
// MEMBERS (1 or 3), KEYWARD_BIN and ETCD_BIN (the binaries).
package testserver

import (
	"fmt"
	"os"
	"strconv"
)

// deployment is the server the tests run against.
type deployment struct {
	// server is "keyward" or "etcd": both take etcd's flags, so only the binary differs.
	server  string
	binary  string
	members int
}

func deploymentFromEnv() (deployment, error) {
	d := deployment{server: envOr("SERVER", "keyward")}
	switch d.server {
	case "keyward":
		d.binary = os.Getenv("KEYWARD_BIN")
		if d.binary == "" {
			return d, fmt.Errorf("testserver: KEYWARD_BIN is not set (run tests/kubernetes/run.sh, which sets it)")
		}
	case "etcd":
		d.binary = envOr("ETCD_BIN", "/usr/bin/etcd")
	default:
		return d, fmt.Errorf("testserver: SERVER=%q: want keyward or etcd", d.server)
	}
	members, err := strconv.Atoi(envOr("MEMBERS", "1"))
	if err != nil || members < 1 {
		return d, fmt.Errorf("testserver: MEMBERS=%q: want a positive number", os.Getenv("MEMBERS"))
	}
	d.members = members
	return d, nil
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}
