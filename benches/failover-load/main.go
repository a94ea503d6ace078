// Command failover-load is the steady write load of benches/failover.sh: one etcd 3.4 clientv3 client
// per endpoint (each pinned to its endpoint, as a Patroni member talks to its own etcd member), each
// starting a put of a fresh key every -every with a per-request deadline, answered or not.
// Every request is one line on stdout: "req ENDPOINT START_NS END_NS ok|err MESSAGE"; the script
// finds the kill time among them. With -verify, after the load it reads every key back through the
// endpoints still up and prints one line:
// "verify acked=N missing=M twice=T unacked_present=U" (missing: acknowledged but absent; twice: a
// key whose version is not 1, i.e. a put applied twice; unacked_present: failed puts that did
// apply, which an ambiguous error allows).
//
// Build (GOPATH mode, Debian's golang-etcd-server-dev): benches/lib/go-build.sh failover-load
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/pkg/logutil"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

type result struct {
	key string
	ok  bool
}

func main() {
	endpoints := flag.String("endpoints", "", "comma-separated endpoints; one client each")
	duration := flag.Duration("duration", 10*time.Second, "how long to put")
	every := flag.Duration("every", 20*time.Millisecond, "one put per endpoint this often, whether the previous one is answered or not")
	timeout := flag.Duration("timeout", 7*time.Second, "each put's deadline (etcd's request timeout: 5 s + 2 election timeouts)")
	prefix := flag.String("prefix", "failover/", "key prefix")
	verify := flag.Bool("verify", true, "read every key back after the load")
	flag.Parse()
	eps := strings.Split(*endpoints, ",")
	if *endpoints == "" {
		fmt.Fprintln(os.Stderr, "failover-load: -endpoints is required")
		os.Exit(2)
	}
	quiet := logutil.DefaultZapLoggerConfig
	quiet.Level = zap.NewAtomicLevelAt(zap.FatalLevel)
	var mu sync.Mutex
	out := make([][]result, len(eps))
	var wg sync.WaitGroup
	end := time.Now().Add(*duration)
	for i, ep := range eps {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second,
			DialOptions: []grpc.DialOption{grpc.WithBlock()}, LogConfig: &quiet})
		if err != nil {
			fmt.Fprintf(os.Stderr, "failover-load: %s: %v\n", ep, err)
			os.Exit(1)
		}
		defer c.Close()
		wg.Add(1)
		go func(i int, ep string, c *clientv3.Client) {
			defer wg.Done()
			var mine []result
			var inflight sync.WaitGroup
			var mineMu sync.Mutex
			// One put every -every, each in its own goroutine: a put held by a dead leader does not
			// hold back the next one, so the first accepted put after a kill is when the member
			// could first accept one.
			ticker := time.NewTicker(*every)
			defer ticker.Stop()
			for seq := 0; time.Now().Before(end); seq++ {
				key := fmt.Sprintf("%s%d/%08d", *prefix, i, seq)
				inflight.Add(1)
				go func(key string) {
					defer inflight.Done()
					ctx, cancel := context.WithTimeout(context.Background(), *timeout)
					start := time.Now()
					_, err := c.Put(ctx, key, "v")
					stop := time.Now()
					cancel()
					msg := "ok -"
					if err != nil {
						msg = "err " + strings.ReplaceAll(err.Error(), "\n", " ")
					}
					mineMu.Lock()
					mine = append(mine, result{key, err == nil})
					mineMu.Unlock()
					mu.Lock()
					fmt.Printf("req %s %d %d %s\n", ep, start.UnixNano(), stop.UnixNano(), msg)
					mu.Unlock()
				}(key)
				<-ticker.C
			}
			inflight.Wait()
			out[i] = mine
		}(i, ep, c)
	}
	wg.Wait()
	if !*verify {
		return
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, LogConfig: &quiet})
	if err != nil {
		fmt.Fprintf(os.Stderr, "failover-load: verify: %v\n", err)
		os.Exit(1)
	}
	defer c.Close()
	var resp *clientv3.GetResponse
	for attempt := 0; attempt < 20; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err = c.Get(ctx, *prefix, clientv3.WithPrefix())
		cancel()
		if err == nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "failover-load: verify get: %v\n", err)
		os.Exit(1)
	}
	version := map[string]int64{}
	for _, kv := range resp.Kvs {
		version[string(kv.Key)] = kv.Version
	}
	acked, missing, twice, unacked := 0, 0, 0, 0
	for _, mine := range out {
		for _, r := range mine {
			v, present := version[r.key]
			if r.ok {
				acked++
				if !present {
					missing++
				}
			} else if present {
				unacked++
			}
			if present && v != 1 {
				twice++
			}
		}
	}
	fmt.Printf("verify acked=%d missing=%d twice=%d unacked_present=%d\n", acked, missing, twice, unacked)
}
