// Package bench holds gpulet's benchmarks against the real binaries. Each
// compares with a floor measured in the same run, so that ratios hold on a
// shared machine; docs/BENCHMARKS.md reports them.
package bench

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/gpulet/gpulet/internal/e2e"
)

func TestMain(m *testing.M) {
	if sock := os.Getenv(floorSocketEnv); sock != "" {
		os.Exit(serveFloor(sock, os.Getenv(floorBodyEnv)))
	}
	os.Exit(e2e.Main(m))
}

// The floor server runs in a process of its own, as gpuletd does, so that both
// sides pay the same cross-process cost.
const (
	floorSocketEnv = "GPULET_BENCH_FLOOR_SOCKET"
	floorBodyEnv   = "GPULET_BENCH_FLOOR_BODY"
)

// serveFloor answers GET with the body file's bytes, POST with them and 201,
// DELETE with 204: the least an HTTP API on a Unix socket can do.
func serveFloor(sock, bodyFile string) int {
	body, err := os.ReadFile(bodyFile)
	if err != nil {
		return 1
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return 1
	}
	http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch r.Method {
		case "DELETE":
			w.WriteHeader(http.StatusNoContent)
		case "POST":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			w.Write(body)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.Write(body)
		}
	}))
	return 0
}

// httpClient is a keep-alive client on a Unix socket; every side of a
// comparison uses the same settings.
func httpClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
		MaxIdleConnsPerHost: 64,
	}}
}

// floorServer starts the floor process answering with body and returns its
// socket.
func floorServer(b *testing.B, body []byte) string {
	b.Helper()
	dir := b.TempDir()
	sock, bodyFile := filepath.Join(dir, "floor.sock"), filepath.Join(dir, "body")
	if err := os.WriteFile(bodyFile, body, 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), floorSocketEnv+"="+sock, floorBodyEnv+"="+bodyFile)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	e2e.Eventually(b, "the floor server", func() bool { _, err := os.Stat(sock); return err == nil })
	return sock
}

// tmpfsRunDir is a run dir on tmpfs, as /run is in production: the ledger's
// FIFOs and the journal cost metadata writes, which a disk file system's
// journal makes tens of times slower.
func tmpfsRunDir(b *testing.B) string {
	b.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "gpulet-bench-")
	if err != nil {
		b.Skip("no tmpfs at /dev/shm:", err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// run spreads b.N calls of op over clients goroutines, each with its own HTTP
// client, and reports p50, p99 and operations per second.
func run(b *testing.B, sock string, clients int, op func(c *http.Client) error) {
	b.Helper()
	lat := make([][]time.Duration, clients)
	per := b.N / clients
	if per == 0 {
		per = 1
	}
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < clients; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c := httpClient(sock)
			lat[w] = make([]time.Duration, 0, per)
			for i := 0; i < per; i++ {
				t0 := time.Now()
				if err := op(c); err != nil {
					errs <- err
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	reportLatencies(b, all)
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "ops/s")
}

func reportLatencies(b *testing.B, d []time.Duration) {
	b.Helper()
	if len(d) == 0 {
		return
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	b.ReportMetric(float64(d[len(d)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(d[(len(d)*99)/100].Nanoseconds()), "p99-ns")
}

// drain reads and closes a response body so the connection is reused.
func drain(resp *http.Response) {
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}
