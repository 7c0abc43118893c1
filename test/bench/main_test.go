// Package bench holds gpulet's benchmarks against the real gpuletd on the
// simulated backend. Every benchmark measures a floor in the same run (the
// least the same work can cost on this machine) so that the ratio means
// something on a shared, small machine; docs/BENCHMARKS.md reports both.
//
// Run them with
//
//	go test -run '^$' -bench . -benchmem ./test/bench/
//
// Figures that are not pass/fail go through b.ReportMetric: p50-ns and p99-ns
// are latency percentiles of the last run of each benchmark, ops/s its
// throughput, and x-floor-* the ratio of gpuletd's figure to the floor's
// (x-inproc-* to the in-process floor's, where there is one).
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

func TestMain(m *testing.M) {
	if sock := os.Getenv(floorSocketEnv); sock != "" {
		os.Exit(serveFloorProcess(sock))
	}
	os.Exit(e2e.Main(m))
}

// startDaemon starts gpuletd with the production sample interval (the e2e
// harness's 100ms is for quick tests) and its run dir on tmpfs, as /run is in
// production; extra flags come last and win.
func startDaemon(b *testing.B, extra ...string) *e2e.Daemon {
	b.Helper()
	return startDaemonBinary(b, e2e.Bin("gpuletd"), extra...)
}

// startDaemonBinary is startDaemon with another gpuletd binary.
func startDaemonBinary(b *testing.B, binary string, extra ...string) *e2e.Daemon {
	b.Helper()
	runDir := tmpfsDir(b)
	d := e2e.StartBinary(b, binary, append([]string{"--sample-interval", "1s", "--run-dir", runDir}, extra...)...)
	d.RunDir = runDir
	return d
}

// tmpfsDir is a fresh folder on /dev/shm, falling back to the test's temporary
// folder where there is no tmpfs. Its name is short: MPS pipe folders within
// it must fit the control daemon's 87 bytes.
func tmpfsDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "gb-")
	if err != nil {
		tb.Logf("no tmpfs at /dev/shm (%v): the run dir is on the temporary folder's file system", err)
		return filepath.Join(tb.TempDir(), "run")
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "run")
}

// httpClient is one keep-alive HTTP client on a Unix socket. Every client of
// every comparison, daemon or floor, is made here (or, with a raw connection
// beside it, by newBenchClient), with the same settings.
func httpClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     time.Minute,
	}}
}

// floorHandler is the least an HTTP/JSON API can do: GET answers body, POST
// answers leaseBody with 201, DELETE answers 204. Request bodies are read, as a
// real handler must.
func floorHandler(body, leaseBody []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.Method {
		case http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		case http.MethodPost:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			w.Write(leaseBody)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.Write(body)
		}
	})
}

// floorServer serves floorHandler on a Unix socket in this process. Client
// and server then share one Go runtime and skip the cross-process wakeups
// that no daemon can skip, so this floor is reported (x-inproc-*) but the
// goals are checked against floor-proc.
func floorServer(tb testing.TB, body, leaseBody []byte) string {
	tb.Helper()
	sock := filepath.Join(tb.TempDir(), "floor.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http.Server{Handler: floorHandler(body, leaseBody)}
	go srv.Serve(ln)
	tb.Cleanup(func() { srv.Close() })
	return sock
}

// The second floor runs floorHandler in a process of its own (this test binary
// started again), so that, like gpuletd, it pays for waking another process on
// every request: the raw HTTP-over-Unix-socket cost of a daemon's request,
// which the goals are checked against.
const (
	floorSocketEnv = "GPULET_BENCH_FLOOR_SOCKET"
	floorBodyEnv   = "GPULET_BENCH_FLOOR_BODY"
	floorLeaseEnv  = "GPULET_BENCH_FLOOR_LEASE"
)

func serveFloorProcess(sock string) int {
	body, err1 := os.ReadFile(os.Getenv(floorBodyEnv))
	lease, err2 := os.ReadFile(os.Getenv(floorLeaseEnv))
	if err := errors.Join(err1, err2); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if dir := os.Getenv(floorMountEnv); dir != "" {
		if err := mountFloorView(dir, body); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	// The parent kills this process; serving until then is the whole job.
	if dir := os.Getenv(floorLedgerEnv); dir != "" {
		err = serveContractFloor(ln, dir, os.Getenv(floorJournalEnv), body, lease)
	} else {
		err = http.Serve(ln, floorHandler(body, lease))
	}
	fmt.Fprintln(os.Stderr, err)
	return 1
}

// floorProcess starts the floor in its own process and returns its socket.
func floorProcess(tb testing.TB, body, leaseBody []byte) string {
	tb.Helper()
	return startFloorProcess(tb, body, leaseBody)
}

// startFloorProcess starts this test binary again as a floor, with env added
// to its environment, and returns its socket once it answers.
func startFloorProcess(tb testing.TB, body, leaseBody []byte, env ...string) string {
	tb.Helper()
	dir := tb.TempDir()
	sock := filepath.Join(dir, "floor.sock")
	bodyFile, leaseFile := filepath.Join(dir, "body"), filepath.Join(dir, "lease")
	if err := errors.Join(os.WriteFile(bodyFile, body, 0o644), os.WriteFile(leaseFile, leaseBody, 0o644)); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), floorSocketEnv+"="+sock, floorBodyEnv+"="+bodyFile, floorLeaseEnv+"="+leaseFile)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	c := httpClient(sock)
	defer c.CloseIdleConnections()
	testutil.Eventually(tb, "the floor process answers", func() bool {
		resp, err := c.Get("http://floor/")
		if err != nil {
			return false
		}
		drain(resp)
		return resp.StatusCode == http.StatusOK
	})
	return sock
}

// result is what one run measured, kept so that gpuletd's run can report its
// ratio to the floor's.
type result struct {
	p50, p99 time.Duration
	opsPerS  float64
}

// run spreads b.N calls of op over clients goroutines, each with its own HTTP
// client, and reports p50, p99 and operations per second. ops/s counts
// whole ops (for a lease, the lease and its release).
func run(b *testing.B, sock string, clients int, op func(c *benchClient) error) result {
	b.Helper()
	per := max(b.N/clients, 1)
	t := newTeam(sock, clients, per)
	defer t.close()
	b.ResetTimer()
	elapsed, err := t.turn(per, op)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	return t.report(b, "", elapsed)
}

// team is clients goroutines' worth of keep-alive HTTP clients to one server,
// with the latency of every op they made.
type team struct {
	hc  []*benchClient
	lat [][]time.Duration
}

func newTeam(sock string, clients, per int) *team {
	t := &team{hc: make([]*benchClient, clients), lat: make([][]time.Duration, clients)}
	for w := range t.hc {
		t.hc[w] = newBenchClient(sock)
		t.lat[w] = make([]time.Duration, 0, per)
	}
	return t
}

func (t *team) close() {
	for _, c := range t.hc {
		c.close()
	}
}

// turn has every client make n calls of op at once and returns the wall time
// until the last one is done.
func (t *team) turn(n int, op func(c *benchClient) error) (time.Duration, error) {
	var wg sync.WaitGroup
	errs := make(chan error, len(t.hc))
	start := time.Now()
	for w := range t.hc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n {
				t0 := time.Now()
				if err := op(t.hc[w]); err != nil {
					errs <- err
					return
				}
				t.lat[w] = append(t.lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	select {
	case err := <-errs:
		return elapsed, err
	default:
		return elapsed, nil
	}
}

// report reports, under names that start with prefix, the latencies of every
// op and the ops per second over elapsed.
func (t *team) report(b *testing.B, prefix string, elapsed time.Duration) result {
	b.Helper()
	all := slices.Concat(t.lat...)
	r := result{opsPerS: float64(len(all)) / elapsed.Seconds()}
	r.p50, r.p99 = reportLatencies(b, prefix, all)
	b.ReportMetric(r.opsPerS, prefix+"ops/s")
	return r
}

// pairedTurn is how many ops each client makes on one server before the other
// server takes its turn: about 10 to 50 ms at 8 clients on a small machine.
const pairedTurn = 40

// paired measures gpuletd against floor-proc in alternating turns (see
// alternate): floor-* and the plain names for gpuletd, and gpuletd's ratios to
// floor-proc (x-floor-*).
func paired(b *testing.B, floorSock, sock string, clients int, op func(c *benchClient) error) {
	b.Helper()
	alternate(b, clients, side{floorSock, op}, side{sock, op}, "floor")
}

// side is one half of an alternating benchmark: a server's socket and the op
// made on it.
type side struct {
	sock string
	op   func(c *benchClient) error
}

// alternate runs base and measured in alternating turns of pairedTurn ops per
// client, the first side alternating too, so that both see the same moments
// of a shared machine whose speed drifts from second to second; b.N ops go to
// each side. It reports base's figures as name-*, measured's under the plain
// names, and measured's ratios to base as x-name-*.
func alternate(b *testing.B, clients int, base, measured side, name string) {
	b.Helper()
	per := max(b.N/clients, 1)
	teams := [2]*team{newTeam(base.sock, clients, per), newTeam(measured.sock, clients, per)}
	defer teams[0].close()
	defer teams[1].close()
	ops := [2]func(*benchClient) error{base.op, measured.op}
	var elapsed [2]time.Duration
	b.ResetTimer()
	for done, round := 0, 0; done < per; done, round = done+pairedTurn, round+1 {
		n := min(pairedTurn, per-done)
		for k := range 2 {
			i := (k + round) % 2
			d, err := teams[i].turn(n, ops[i])
			if err != nil {
				b.Fatal(err)
			}
			elapsed[i] += d
		}
	}
	b.StopTimer()
	r := teams[0].report(b, name+"-", elapsed[0])
	reportRatio(b, teams[1].report(b, "", elapsed[1]), r, name)
}

// reportLatencies reports the p50 and p99 of d (sorting it) under names that
// start with prefix.
func reportLatencies(b *testing.B, prefix string, d []time.Duration) (p50, p99 time.Duration) {
	b.Helper()
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	p50, p99 = d[len(d)/2], d[len(d)*99/100]
	b.ReportMetric(float64(p50.Nanoseconds()), prefix+"p50-ns")
	b.ReportMetric(float64(p99.Nanoseconds()), prefix+"p99-ns")
	return p50, p99
}

// reportRatio reports r against floor as x-<name>-p50, -p99 (lower is
// better) and -ops (higher is better).
func reportRatio(b *testing.B, r, floor result, name string) {
	b.Helper()
	if floor.p50 == 0 || floor.opsPerS == 0 {
		return
	}
	b.ReportMetric(float64(r.p50)/float64(floor.p50), "x-"+name+"-p50")
	b.ReportMetric(float64(r.p99)/float64(floor.p99), "x-"+name+"-p99")
	b.ReportMetric(r.opsPerS/floor.opsPerS, "x-"+name+"-ops")
}

// drain reads and closes a response body so that the connection is reused.
func drain(resp *http.Response) {
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// getSnapshot is GET /v1/snapshot, body read and dropped.
func getSnapshot(c *http.Client) error {
	resp, err := c.Get("http://gpulet/v1/snapshot")
	if err != nil {
		return err
	}
	drain(resp)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("snapshot: HTTP %d", resp.StatusCode)
	}
	return nil
}

// snapshot is GET /v1/snapshot, decoded.
func snapshot(c *http.Client) (*api.Snapshot, error) {
	resp, err := c.Get("http://gpulet/v1/snapshot")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("snapshot: HTTP %d: %s", resp.StatusCode, body)
	}
	var s api.Snapshot
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// offline is the node's units_offline.
func offline(s *api.Snapshot) int {
	n := 0
	for _, g := range s.GPUs {
		n += g.UnitsOffline
	}
	return n
}

// pollUntil GETs the snapshot in a tight loop until cond holds, and returns
// the time at which the snapshot that satisfied it had been received. It
// fails after timeout.
func pollUntil(tb testing.TB, c *http.Client, timeout time.Duration, what string, cond func(*api.Snapshot) bool) time.Time {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	var last *api.Snapshot
	for {
		s, err := snapshot(c)
		now := time.Now()
		if err != nil {
			tb.Fatalf("waiting for %s: %v", what, err)
		}
		if cond(s) {
			return now
		}
		last = s
		if now.After(deadline) {
			tb.Fatalf("waiting for %s: not within %s; last snapshot: units_free %d, units_offline %d", what, timeout, last.UnitsFree, offline(last))
		}
	}
}

// TestFloorServers checks that both floors answer what the benchmarks ask of
// them, and that the helpers measure; it starts no daemon.
func TestFloorServers(t *testing.T) {
	body := []byte(`{"schema":"gpulet.snapshot/v1","units_total":32,"units_free":32,"gpus":[{"index":0,"units_offline":0}]}` + "\n")
	lease := []byte(`{"id":"l-0123456789abcdef","units":[0]}` + "\n")
	for name, sock := range map[string]string{"in-process": floorServer(t, body, lease), "process": floorProcess(t, body, lease)} {
		c := newBenchClient(sock)
		s, err := snapshot(c.Client)
		if err != nil || s.UnitsFree != 32 {
			t.Fatalf("%s floor: snapshot %+v, %v", name, s, err)
		}
		if err := leaseRelease(c); err != nil {
			t.Fatalf("%s floor: lease and release: %v", name, err)
		}
		c.close()
	}
	// The contract floor makes the unit's FIFO and a journal record for the
	// lease, and removes the FIFO and records the end for the release.
	sock, dir, journalPath := contractFloorProcess(t, body, lease)
	c := newBenchClient(sock)
	defer c.close()
	if err := leaseRelease(c); err != nil {
		t.Fatalf("contract floor: lease and release: %v", err)
	}
	names, err := os.ReadDir(dir)
	journal, jerr := os.ReadFile(journalPath)
	if err != nil || jerr != nil || len(names) != 0 || bytes.Count(journal, []byte("\n")) != 2 {
		t.Fatalf("contract floor after a lease and its release: folder %v (%v), journal %q (%v)", names, err, journal, jerr)
	}
}
