// Command clientv3-load drives put, range and txn-put load against an etcd v3 endpoint with etcd
// 3.4's own Go client (go.etcd.io/etcd/clientv3), so that keyward and etcd can be measured with the
// client the performance issue names. Its options are the subset of keyward-bench's that
// benches/compare.sh passes for a cell, and its JSON report has keyward-bench's fields.
//
// Build (GOPATH mode, with Debian's golang-etcd-server-dev sources): benches/lib/go-build.sh clientv3-load
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/ioutil"
	"math"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/etcdserver/api/v3rpc/rpctypes"
	"go.etcd.io/etcd/pkg/logutil"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

const clientName = "clientv3 (go.etcd.io/etcd 3.4)"

// drainGrace is how long requests still in flight at the end of a --duration run may take before
// they are cancelled (and counted as errors): clientv3 waits for a ready connection by default, so
// a stalled server would otherwise hang the run.
const drainGrace = 10 * time.Second

// durationFlag reads a duration as keyward-bench does: Go's syntax ("5s", "1m30s") or a bare number
// of seconds; it must be positive.
type durationFlag struct {
	d   time.Duration
	set bool
}

func (f *durationFlag) String() string { return f.d.String() }

func (f *durationFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		secs, perr := strconv.ParseFloat(s, 64)
		if perr != nil || math.IsNaN(secs) || math.IsInf(secs, 0) {
			return fmt.Errorf("invalid duration %q", s)
		}
		d = time.Duration(secs * float64(time.Second))
	}
	if d <= 0 {
		return fmt.Errorf("invalid duration %q: must be positive", s)
	}
	f.d, f.set = d, true
	return nil
}

type options struct {
	endpoints   string
	clients     int
	conns       int
	total       int64
	duration    durationFlag
	prefix      string
	keySize     int
	valSize     int
	keySpace    int64
	sequential  bool
	user        string
	password    string
	cacert      string
	cert        string
	key         string
	dialTimeout durationFlag
	writeOut    string
	consistency string
	txnOps      int64
	workload    string
	rangeKey    *string
	rangeEnd    string
}

// parseArgs parses keyward-bench's global options wherever they are: Go's flag package stops at the
// first non-flag argument, so parsing resumes after each positional one (the workload, and range's
// optional KEY and RANGE_END).
func parseArgs(args []string) (*options, error) {
	o := &options{dialTimeout: durationFlag{d: 5 * time.Second}}
	fs := flag.NewFlagSet("clientv3-load", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: clientv3-load [options] put|range [KEY [RANGE_END]] [--consistency l|s]|txn-put [--txn-ops N]\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&o.endpoints, "endpoints", "127.0.0.1:2379", "comma-separated endpoints: host:port, http://host:port or https://host:port")
	fs.IntVar(&o.clients, "clients", 1, "concurrent clients, each with one request in flight")
	fs.IntVar(&o.conns, "conns", 1, "clientv3.Client instances (gRPC connections); client i uses instance i mod conns")
	fs.Int64Var(&o.total, "total", 0, "total requests (default 10000 unless --duration is given)")
	fs.Var(&o.duration, "duration", "run for this long (5s, 500ms); with --total, whichever comes first")
	fs.StringVar(&o.prefix, "prefix", "", "prefix of every key")
	fs.IntVar(&o.keySize, "key-size", 8, "key size: the prefix and the key's index, zero-padded to this size")
	fs.IntVar(&o.valSize, "val-size", 8, "value size in bytes")
	fs.Int64Var(&o.keySpace, "key-space", 1, "number of distinct keys (drawn uniformly)")
	fs.Int64Var(&o.keySpace, "key-space-size", 1, "alias of --key-space")
	fs.BoolVar(&o.sequential, "sequential-keys", false, "write keys in order instead of at random")
	fs.StringVar(&o.user, "user", "", "user name (name or name:password)")
	fs.StringVar(&o.password, "password", "", "password of --user")
	fs.StringVar(&o.cacert, "cacert", "", "CA bundle of the server certificates")
	fs.StringVar(&o.cert, "cert", "", "client certificate (PEM)")
	fs.StringVar(&o.key, "key", "", "private key of --cert (PEM)")
	fs.Var(&o.dialTimeout, "dial-timeout", "connection (and authentication) timeout")
	fs.StringVar(&o.writeOut, "w", "simple", "output format: simple or json")
	fs.StringVar(&o.writeOut, "write-out", "simple", "output format: simple or json")
	fs.StringVar(&o.consistency, "consistency", "l", "range: l (linearizable) or s (serializable)")
	fs.Int64Var(&o.txnOps, "txn-ops", 1, "txn-put: puts per transaction")

	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
	if len(positional) == 0 {
		return nil, errors.New("no workload given (put, range or txn-put)")
	}
	o.workload = positional[0]
	extra := positional[1:]
	switch o.workload {
	case "put", "txn-put":
		if len(extra) > 0 {
			return nil, fmt.Errorf("unexpected argument %q", extra[0])
		}
	case "range":
		if len(extra) > 2 {
			return nil, fmt.Errorf("unexpected argument %q", extra[2])
		}
		if len(extra) > 0 {
			o.rangeKey = &extra[0]
		}
		if len(extra) > 1 {
			o.rangeEnd = extra[1]
		}
	default:
		// watch, authenticate, setup-auth, bcrypt: keyward-bench only.
		return nil, fmt.Errorf("workload %q is not supported (put, range, txn-put; use keyward-bench for the others)", o.workload)
	}
	switch {
	case o.clients < 1 || o.conns < 1:
		return nil, errors.New("--conns and --clients must be at least 1")
	case o.keySpace < 1:
		return nil, errors.New("--key-space must be at least 1")
	case o.total < 0:
		return nil, errors.New("--total must be at least 1")
	case (o.cert == "") != (o.key == ""):
		return nil, errors.New("--cert and --key go together")
	case o.consistency != "l" && o.consistency != "s":
		return nil, fmt.Errorf("--consistency %q: l or s", o.consistency)
	case o.writeOut != "simple" && o.writeOut != "json":
		return nil, fmt.Errorf("-w %q: simple or json", o.writeOut)
	case o.workload == "txn-put" && (o.txnOps < 1 || o.txnOps > o.keySpace):
		return nil, fmt.Errorf("--txn-ops must be between 1 and --key-space (%d)", o.keySpace)
	}
	if o.total == 0 && !o.duration.set {
		o.total = 10000
	}
	if o.user != "" && o.password == "" {
		if i := strings.IndexByte(o.user, ':'); i >= 0 {
			o.user, o.password = o.user[:i], o.user[i+1:]
		}
	}
	return o, nil
}

// keys names keys exactly as keyward-bench's Keys: the prefix, then the index zero-padded to at least
// the digits of the largest index and to --key-size overall.
type keys struct {
	prefix string
	width  int
	space  int64
	seq    bool
}

func newKeys(o *options) keys {
	width := len(strconv.FormatInt(o.keySpace-1, 10))
	if w := o.keySize - len(o.prefix); w > width {
		width = w
	}
	return keys{prefix: o.prefix, width: width, space: o.keySpace, seq: o.sequential}
}

func (k keys) index(rng *rand.Rand, n int64) int64 {
	if k.seq {
		return n % k.space
	}
	return rng.Int63n(k.space)
}

func (k keys) key(i int64) string {
	return fmt.Sprintf("%s%0*d", k.prefix, k.width, i)
}

func tlsConfig(o *options) (*tls.Config, error) {
	if o.cacert == "" && o.cert == "" {
		return nil, nil
	}
	cfg := &tls.Config{}
	if o.cacert != "" {
		pem, err := ioutil.ReadFile(o.cacert)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no certificates", o.cacert)
		}
	}
	if o.cert != "" {
		pair, err := tls.LoadX509KeyPair(o.cert, o.key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// connect opens --conns clientv3 clients. Each is given one endpoint (round-robin), as
// keyward-bench pins each connection to one endpoint, so --conns N is N HTTP/2 connections also
// against a cluster. WithBlock makes a server that is not there a dial error within --dial-timeout
// rather than a stream of request errors (WithReturnConnectionError says why, e.g. a refused TLS
// handshake); with --user, clientv3 authenticates at dial and renews the token itself on "invalid
// auth token".
func connect(o *options) ([]*clientv3.Client, error) {
	tlsCfg, err := tlsConfig(o)
	if err != nil {
		return nil, fmt.Errorf("TLS: %v", err)
	}
	var endpoints []string
	for _, e := range strings.Split(o.endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			endpoints = append(endpoints, e)
		}
	}
	if len(endpoints) == 0 {
		return nil, errors.New("--endpoints is empty")
	}
	logCfg := logutil.DefaultZapLoggerConfig
	logCfg.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
	clients := make([]*clientv3.Client, 0, o.conns)
	for i := 0; i < o.conns; i++ {
		ep := endpoints[i%len(endpoints)]
		c, err := clientv3.New(clientv3.Config{
			Endpoints:   []string{ep},
			DialTimeout: o.dialTimeout.d,
			TLS:         tlsCfg,
			Username:    o.user,
			Password:    o.password,
			DialOptions: []grpc.DialOption{grpc.WithBlock(), grpc.WithReturnConnectionError()},
			LogConfig:   &logCfg,
		})
		if err != nil {
			for _, c := range clients {
				c.Close()
			}
			return nil, fmt.Errorf("connect to %s: %v", ep, err)
		}
		clients = append(clients, c)
	}
	return clients, nil
}

// describe names an error as keyward-bench does ("Code: message"), so error_kinds match.
func describe(err error) string {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code().String() + ": " + ee.Error()
	}
	if s, ok := status.FromError(err); ok {
		return s.Code().String() + ": " + s.Message()
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "DeadlineExceeded: " + err.Error()
	case errors.Is(err, context.Canceled):
		return "Canceled: " + err.Error()
	}
	return err.Error()
}

// recorder is one client's measurements: latencies of successful requests in microseconds and
// failures by message.
type recorder struct {
	latencies []uint32
	errs      map[string]uint64
}

type latency struct {
	Mean float64 `json:"mean"`
	P50  uint32  `json:"p50"`
	P90  uint32  `json:"p90"`
	P99  uint32  `json:"p99"`
	Max  uint32  `json:"max"`
}

// percentiles are nearest-rank, as keyward-bench's report.rs computes them.
func percentiles(s []uint32) latency {
	if len(s) == 0 {
		return latency{}
	}
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := func(q float64) uint32 {
		r := int(math.Ceil(q * float64(len(s))))
		if r < 1 {
			r = 1
		}
		if r > len(s) {
			r = len(s)
		}
		return s[r-1]
	}
	var sum uint64
	for _, v := range s {
		sum += uint64(v)
	}
	return latency{Mean: round3(float64(sum) / float64(len(s))), P50: rank(0.5), P90: rank(0.9), P99: rank(0.99), Max: s[len(s)-1]}
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

type summary struct {
	Workload   string            `json:"workload"`
	Client     string            `json:"client"`
	Endpoints  []string          `json:"endpoints"`
	Conns      int               `json:"conns"`
	Clients    int               `json:"clients"`
	Unit       string            `json:"unit"`
	OK         uint64            `json:"ok"`
	Errors     uint64            `json:"errors"`
	ElapsedS   float64           `json:"elapsed_s"`
	Throughput float64           `json:"throughput"`
	LatencyUS  latency           `json:"latency_us"`
	ErrorKinds map[string]uint64 `json:"error_kinds"`
}

func run(o *options) (*summary, error) {
	ks := newKeys(o)
	value := make([]byte, o.valSize)
	rand.Read(value)
	val := string(value)

	// op sends request number n; rng is the calling client's own.
	var name string
	var op func(ctx context.Context, c *clientv3.Client, rng *rand.Rand, n int64) error
	switch o.workload {
	case "put":
		name = "put"
		op = func(ctx context.Context, c *clientv3.Client, rng *rand.Rand, n int64) error {
			_, err := c.Put(ctx, ks.key(ks.index(rng, n)), val)
			return err
		}
	case "range":
		key := ks.key(0)
		if o.rangeKey != nil {
			key = *o.rangeKey
		}
		var opts []clientv3.OpOption
		if o.rangeEnd != "" {
			opts = append(opts, clientv3.WithRange(o.rangeEnd))
		}
		name = "range (linearizable)"
		if o.consistency == "s" {
			name = "range (serializable)"
			opts = append(opts, clientv3.WithSerializable())
		}
		op = func(ctx context.Context, c *clientv3.Client, _ *rand.Rand, _ int64) error {
			_, err := c.Get(ctx, key, opts...)
			return err
		}
	case "txn-put":
		// keyward-bench's txn-put: no compares, --txn-ops puts of consecutive keys from a random one.
		name = "txn-put"
		op = func(ctx context.Context, c *clientv3.Client, rng *rand.Rand, n int64) error {
			first := ks.index(rng, n*o.txnOps)
			puts := make([]clientv3.Op, o.txnOps)
			for i := range puts {
				puts[i] = clientv3.OpPut(ks.key((first+int64(i))%ks.space), val)
			}
			_, err := c.Txn(ctx).Then(puts...).Commit()
			return err
		}
	}

	conns, err := connect(o)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()

	start := time.Now()
	ctx := context.Background()
	var deadline time.Time
	if o.duration.set {
		deadline = start.Add(o.duration.d)
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(drainGrace))
		defer cancel()
	}
	var issued int64
	// take hands out the next request number, or false when the budget is spent.
	take := func() (int64, bool) {
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return 0, false
		}
		n := atomic.AddInt64(&issued, 1) - 1
		if o.total > 0 && n >= o.total {
			return 0, false
		}
		return n, true
	}
	perClient := 1 << 16
	if o.total > 0 && o.total/int64(o.clients)+1 < int64(perClient) {
		perClient = int(o.total/int64(o.clients) + 1)
	}
	recs := make([]recorder, o.clients)
	var wg sync.WaitGroup
	for id := 0; id < o.clients; id++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			c := conns[id%len(conns)]
			rng := rand.New(rand.NewSource(time.Now().UnixNano() + int64(id)*7919))
			rec := recorder{latencies: make([]uint32, 0, perClient), errs: map[string]uint64{}}
			for {
				n, ok := take()
				if !ok {
					break
				}
				sent := time.Now()
				if err := op(ctx, c, rng, n); err != nil {
					rec.errs[describe(err)]++
					continue
				}
				us := time.Since(sent).Microseconds()
				if us > math.MaxUint32 {
					us = math.MaxUint32
				}
				rec.latencies = append(rec.latencies, uint32(us))
			}
			recs[id] = rec
		}(id)
	}
	wg.Wait()
	elapsed := time.Since(start)

	var all []uint32
	kinds := map[string]uint64{}
	var errs uint64
	for _, r := range recs {
		all = append(all, r.latencies...)
		for m, n := range r.errs {
			kinds[m] += n
			errs += n
		}
	}
	s := &summary{
		Workload:   name,
		Client:     clientName,
		Endpoints:  strings.Split(o.endpoints, ","),
		Conns:      o.conns,
		Clients:    o.clients,
		Unit:       "requests",
		OK:         uint64(len(all)),
		Errors:     errs,
		ElapsedS:   round3(elapsed.Seconds()),
		ErrorKinds: kinds,
	}
	if elapsed > 0 {
		s.Throughput = round3(float64(len(all)) / elapsed.Seconds())
	}
	s.LatencyUS = percentiles(all)
	return s, nil
}

func printText(s *summary) {
	ms := func(us float64) float64 { return us / 1000 }
	l := s.LatencyUS
	fmt.Printf("%s against %s (%d conns, %d clients, %s)\n", s.Workload, strings.Join(s.Endpoints, ","), s.Conns, s.Clients, s.Client)
	fmt.Printf("  %-19s%d ok, %d errors\n", "requests:", s.OK, s.Errors)
	fmt.Printf("  %-19s%.3f s\n", "elapsed:", s.ElapsedS)
	fmt.Printf("  %-19s%.1f requests/s\n", "throughput:", s.Throughput)
	fmt.Printf("  %-19sp50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.3f ms, mean %.3f ms\n", "latency:",
		ms(float64(l.P50)), ms(float64(l.P90)), ms(float64(l.P99)), ms(float64(l.Max)), ms(l.Mean))
	if len(s.ErrorKinds) > 0 {
		fmt.Println("  errors by message:")
		msgs := make([]string, 0, len(s.ErrorKinds))
		for m := range s.ErrorKinds {
			msgs = append(msgs, m)
		}
		sort.Strings(msgs)
		for _, m := range msgs {
			fmt.Printf("    %8d  %s\n", s.ErrorKinds[m], m)
		}
	}
}

func main() {
	o, err := parseArgs(os.Args[1:])
	if err == flag.ErrHelp {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "clientv3-load:", err)
		os.Exit(2)
	}
	s, err := run(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "clientv3-load:", err)
		os.Exit(1)
	}
	if o.writeOut == "json" {
		enc := json.NewEncoder(os.Stdout)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(s); err != nil {
			fmt.Fprintln(os.Stderr, "clientv3-load:", err)
			os.Exit(1)
		}
		return
	}
	printText(s)
}
