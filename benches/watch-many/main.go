// Command watch-many measures many watchers with etcd 3.4's own Go client (clientv3), as
// kube-apiserver uses it: --watchers single-key watchers (keys wm/00000...), all on one gRPC stream
// (one context: clientv3 multiplexes them) or each on a stream of its own (--streams=each), created
// one at a time as clientv3 creates them; then puts to those keys, each value stamped with its send
// time, and every event's latency (receipt minus stamp) is recorded.
//
//	--rate N    paced: N puts/s to random watched keys for --duration
//	--burst     then one put to every key at once (--burst-clients concurrent putters)
//
// Prints one JSON line: creation time, event latency percentiles (ms) per phase, missing events, and
// the puts' own latency (an event's latency counts its put's commit too).
//
// Build: benches/lib/go-build.sh watch-many (GOPATH mode against Debian's etcd 3.4 sources).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/clientv3"
	"google.golang.org/grpc/metadata"
)

type phase struct {
	mu        sync.Mutex
	latencies []time.Duration
}

func (p *phase) add(d time.Duration) {
	p.mu.Lock()
	p.latencies = append(p.latencies, d)
	p.mu.Unlock()
}

func (p *phase) summary() map[string]float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := append([]time.Duration(nil), p.latencies...)
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	at := func(q float64) float64 {
		if len(l) == 0 {
			return 0
		}
		i := int(q * float64(len(l)-1))
		return float64(l[i]) / 1e6
	}
	return map[string]float64{"events": float64(len(l)), "p50_ms": at(0.50), "p90_ms": at(0.90), "p99_ms": at(0.99), "max_ms": at(1)}
}

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "comma-separated endpoints")
	watchers := flag.Int("watchers", 10000, "single-key watchers")
	streams := flag.String("streams", "one", "one: every watcher on one stream; each: a stream per watcher")
	rate := flag.Int("rate", 200, "paced puts per second (0: no paced phase)")
	duration := flag.Duration("duration", 10*time.Second, "length of the paced phase")
	burst := flag.Bool("burst", true, "then one put per key at once")
	burstClients := flag.Int("burst-clients", 64, "concurrent putters in the burst")
	label := flag.String("label", "", "label for the report")
	flag.Parse()

	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*endpoints, ","), DialTimeout: 10 * time.Second,
		MaxCallRecvMsgSize: 64 << 20})
	if err != nil {
		fail("connect: %v", err)
	}
	defer cli.Close()
	key := func(i int) string { return fmt.Sprintf("wm/%05d", i) }

	var current atomic.Value // *phase
	current.Store(&phase{})
	var received int64
	created := time.Now()
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := 0; i < *watchers; i++ {
		wctx := ctx
		if *streams == "each" {
			// clientv3 keys its streams by the context's metadata: distinct metadata, a stream each.
			wctx = metadata.AppendToOutgoingContext(ctx, "watch-many-stream", strconv.Itoa(i))
		}
		ch := cli.Watch(clientv3.WithRequireLeader(wctx), key(i), clientv3.WithCreatedNotify())
		first := <-ch // created: clientv3 sends the next create only after this one's
		if first.Err() != nil || !first.Created {
			fail("watch %d: %v", i, first.Err())
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for resp := range ch {
				now := time.Now().UnixNano()
				for _, ev := range resp.Events {
					sent, err := strconv.ParseInt(string(ev.Kv.Value), 10, 64)
					if err == nil {
						current.Load().(*phase).add(time.Duration(now - sent))
						atomic.AddInt64(&received, 1)
					}
				}
			}
		}()
	}
	creation := time.Since(created)

	var putLatency atomic.Value // *phase: how long each put took, to tell the put's share of an event's latency
	putLatency.Store(&phase{})
	put := func(i int) {
		start := time.Now()
		v := strconv.FormatInt(start.UnixNano(), 10)
		if _, err := cli.Put(ctx, key(i), v); err != nil {
			fail("put: %v", err)
		}
		putLatency.Load().(*phase).add(time.Since(start))
	}
	waitFor := func(want int64) int64 {
		deadline := time.Now().Add(30 * time.Second)
		for atomic.LoadInt64(&received) < want && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		return want - atomic.LoadInt64(&received)
	}
	report := map[string]interface{}{"label": *label, "watchers": *watchers, "streams": *streams,
		"creation_s": creation.Seconds()}
	sent := int64(0)
	if *rate > 0 {
		paced, puts := &phase{}, &phase{}
		current.Store(paced)
		putLatency.Store(puts)
		tick := time.NewTicker(time.Second / time.Duration(*rate))
		end := time.Now().Add(*duration)
		var inflight sync.WaitGroup
		for time.Now().Before(end) {
			<-tick.C
			i := rand.Intn(*watchers)
			sent++
			inflight.Add(1)
			go func() { defer inflight.Done(); put(i) }()
		}
		tick.Stop()
		inflight.Wait()
		missing := waitFor(sent)
		s := paced.summary()
		s["missing"] = float64(missing)
		report["paced"] = s
		report["paced_puts"] = puts.summary()
		report["paced_rate"] = *rate
	}
	if *burst {
		b, puts := &phase{}, &phase{}
		current.Store(b)
		putLatency.Store(puts)
		next := int64(-1)
		var putters sync.WaitGroup
		for c := 0; c < *burstClients; c++ {
			putters.Add(1)
			go func() {
				defer putters.Done()
				for {
					i := int(atomic.AddInt64(&next, 1))
					if i >= *watchers {
						return
					}
					put(i)
				}
			}()
		}
		putters.Wait()
		sent += int64(*watchers)
		missing := waitFor(sent)
		s := b.summary()
		s["missing"] = float64(missing)
		report["burst"] = s
		report["burst_puts"] = puts.summary()
	}
	out, _ := json.Marshal(report)
	fmt.Println(string(out))
	cancel()
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "watch-many: "+format+"\n", args...)
	os.Exit(1)
}
