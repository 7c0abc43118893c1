// Package liveheap measures gpuletd's live heap, run in the test's own
// process so that the runtime can be asked for it (and for a heap profile),
// where test/bench's BenchmarkMemory sees only the resident set of the real
// binary. It is a package of its own so that test/bench's floor, a bare HTTP
// server that is that package's test binary started again, does not carry
// the daemon's code and start-up.
//
// Run it with
//
//	go test -run '^$' -bench LiveHeap -benchtime 1x ./test/bench/liveheap/
//
// and, for a profile by allocation site,
//
//	GPULET_BENCH_HEAP_PROFILE=/tmp/heap go test -run '^$' -bench LiveHeap -benchtime 1x -memprofilerate 1 ./test/bench/liveheap/
//	go tool pprof -sample_index=inuse_space -top /tmp/heap.held
package liveheap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
)

// heapProfileEnv names a file prefix: BenchmarkLiveHeap writes the heap
// profiles of gpuletd's engine holding the leases (<prefix>.held) and right
// after replaying them (<prefix>.replayed) there, for
// go tool pprof -sample_index=inuse_space -top.
const heapProfileEnv = "GPULET_BENCH_HEAP_PROFILE"

// BenchmarkLiveHeap is the live heap of gpuletd (agent.Run, as cmd/gpuletd
// runs it, with test/bench's BenchmarkMemory's flags): idle on 16 simulated
// GPUs, holding 10,240 one-unit ttl leases, and after a second Run on the
// same run dir replayed them. Reported: the live heap after a collection in
// each state, in MB, and the bytes each held lease adds to it. The resident
// set BenchmarkMemory measures grows with the live heap several times over
// (the collector's pace, GOGC 400, lets garbage reach four times the live
// heap before it collects). With GPULET_BENCH_HEAP_PROFILE set, it writes
// the heap profiles too.
func BenchmarkLiveHeap(b *testing.B) {
	const held, gpus = 10240, 16
	for range b.N {
		dir := b.TempDir()
		units := strconv.Itoa(64 + held/gpus)
		cfg, err := agent.ParseFlags([]string{
			"--socket", filepath.Join(dir, "gpulet.sock"), "--run-dir", runDir(b), "--state-dir", filepath.Join(dir, "state"),
			"--mount", "", "--backend", "sim", "--node-name", "live-heap", "--sample-interval", "1s", "--mps", "off",
			"--sim-gpus", fmt.Sprintf("%dxA100-80GB", gpus), "--clients-per-instance", units, "--units-per-gpu", units,
		}, io.Discard)
		if err != nil {
			b.Fatal(err)
		}
		cfg.Logger = slog.New(slog.DiscardHandler)

		stop := runAgent(b, cfg)
		idle := liveHeap()
		holdLeases(b, &client.Client{Socket: cfg.Socket}, held)
		holding := liveHeap()
		writeHeapProfile(b, "held")
		stop()

		stop = runAgent(b, cfg)
		replayed := liveHeap()
		writeHeapProfile(b, "replayed")
		stop()

		b.ReportMetric(float64(idle)/1e6, "idle-live-MB")
		b.ReportMetric(float64(holding)/1e6, "held-live-MB")
		b.ReportMetric(float64(replayed)/1e6, "replayed-live-MB")
		b.ReportMetric(float64(holding-idle)/held, "held-B/lease")
		b.ReportMetric(float64(replayed-idle)/held, "replayed-B/lease")
	}
}

// runAgent runs gpuletd in this process until it answers, and returns what
// stops it and waits for its end.
func runAgent(tb testing.TB, cfg agent.Config) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx, cfg) }()
	c := &client.Client{Socket: cfg.Socket}
	// A start that replays 10,240 leases with every allocation profiled
	// takes several seconds on a loaded machine.
	for deadline := time.Now().Add(time.Minute); ; {
		ask, cancelAsk := context.WithTimeout(ctx, time.Second)
		_, err := c.Snapshot(ask)
		cancelAsk()
		if err == nil {
			break
		}
		select {
		case err := <-done:
			tb.Fatalf("gpuletd ended during its start: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("gpuletd did not answer within a minute: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return func() {
		cancel()
		if err := <-done; err != nil {
			tb.Fatal(err)
		}
	}
}

// liveHeap is the heap's live bytes after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// writeHeapProfile writes the heap profile to $GPULET_BENCH_HEAP_PROFILE.state
// when that is set.
func writeHeapProfile(tb testing.TB, state string) {
	tb.Helper()
	prefix := os.Getenv(heapProfileEnv)
	if prefix == "" {
		return
	}
	f, err := os.Create(prefix + "." + state)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		tb.Fatal(err)
	}
}

// holdLeases takes n one-unit leases of an hour, from 8 clients at once as
// test/bench does.
func holdLeases(tb testing.TB, c *client.Client, n int) {
	tb.Helper()
	const parallel = 8
	errs := make(chan error, parallel)
	for w := range parallel {
		go func() {
			for i := w; i < n; i += parallel {
				if _, err := c.Lease(context.Background(), api.LeaseRequest{Units: 1, TTL: "1h"}); err != nil {
					errs <- fmt.Errorf("lease %d: %w", i, err)
					return
				}
			}
			errs <- nil
		}()
	}
	var all []error
	for range parallel {
		all = append(all, <-errs)
	}
	if err := errors.Join(all...); err != nil {
		tb.Fatal(err)
	}
}

// runDir is a run dir on /dev/shm, as /run is tmpfs in production, or in
// the test's temporary folder where there is no tmpfs.
func runDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "gpulet-liveheap-")
	if err != nil {
		tb.Logf("no tmpfs at /dev/shm (%v): the run dir is on the temporary folder's file system", err)
		return filepath.Join(tb.TempDir(), "run")
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "run")
}
