package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/api"
)

// claim is one offline claim made by this process: the locked descriptor it
// keeps open and the unit FIFO's path.
type claim struct {
	fd   int
	path string
}

// claimUnit claims unit i in the instance folder dir by the protocol of
// docs/design.md §5: mkfifo under a temporary name starting with ".", open
// O_RDWR|O_NONBLOCK, flock(LOCK_EX), link(2) to unit-<i>, unlink the temporary
// name, keep the descriptor. It returns the moment just before link(2), when
// the claim comes into being.
func claimUnit(dir string, i int) (claim, time.Time, error) {
	tmp := filepath.Join(dir, ".bench-"+strconv.Itoa(i))
	path := filepath.Join(dir, "unit-"+strconv.Itoa(i))
	if err := unix.Mkfifo(tmp, 0o600); err != nil {
		return claim{}, time.Time{}, fmt.Errorf("mkfifo %s: %w", tmp, err)
	}
	fd, err := unix.Open(tmp, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Unlink(tmp)
		return claim{}, time.Time{}, fmt.Errorf("open %s: %w", tmp, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		unix.Close(fd)
		unix.Unlink(tmp)
		return claim{}, time.Time{}, fmt.Errorf("flock %s: %w", tmp, err)
	}
	t0 := time.Now()
	err = unix.Link(tmp, path)
	unix.Unlink(tmp)
	if err != nil {
		unix.Close(fd)
		return claim{}, time.Time{}, fmt.Errorf("link %s: %w", path, err)
	}
	return claim{fd: fd, path: path}, t0, nil
}

// release ends the claim: the FIFO goes, then the lock.
func (c claim) release() error {
	err := unix.Unlink(c.path)
	if errors.Is(err, unix.ENOENT) {
		err = nil
	}
	return errors.Join(err, unix.Close(c.fd))
}

// instanceDirs reads <run-dir>/units/layout.json as an offline claimer does
// and returns, per GPU index, the folder of its instance 0 (which owns every
// unit with one instance per GPU).
func instanceDirs(tb testing.TB, runDir string) []string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(runDir, "units", "layout.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var lay struct {
		GPUs []struct {
			Index     int    `json:"index"`
			UUID      string `json:"uuid"`
			Instances []struct {
				Instance int `json:"instance"`
			} `json:"instances"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(b, &lay); err != nil {
		tb.Fatal(err)
	}
	dirs := make([]string, len(lay.GPUs))
	for _, g := range lay.GPUs {
		if len(g.Instances) != 1 {
			tb.Fatalf("layout: GPU %d has %d instances; the benchmarks expect one", g.Index, len(g.Instances))
		}
		dirs[g.Index] = filepath.Join(runDir, "units", g.UUID, strconv.Itoa(g.Instances[0].Instance))
	}
	return dirs
}

// BenchmarkOfflineClaim is the time from link(2) of a claim FIFO to the first
// GET /v1/snapshot that counts it (polling in a tight loop), and from the
// FIFO's removal to the first snapshot that no longer does (release-*). The
// floor is the same claim seen by a bare inotify watcher (fsnotify, as gpuletd
// uses) in this process: what the kernel alone costs. Goal: gpuletd's p99 ≤ 10ms.
func BenchmarkOfflineClaim(b *testing.B) {
	d := startDaemon(b)
	dir := instanceDirs(b, d.RunDir)[0]
	c := httpClient(d.Socket)
	defer c.CloseIdleConnections()

	b.Run("floor", func(b *testing.B) {
		fdir := filepath.Join(tmpfsDir(b), "units")
		if err := os.MkdirAll(fdir, 0o755); err != nil {
			b.Fatal(err)
		}
		w, err := fsnotify.NewBufferedWatcher(4096)
		if err != nil {
			b.Fatal(err)
		}
		defer w.Close()
		if err := w.Add(fdir); err != nil {
			b.Fatal(err)
		}
		unitPath := filepath.Join(fdir, "unit-0")
		// seen gets the moment the watcher saw unit-0 created.
		seen := make(chan time.Time, 1)
		go func() {
			for ev := range w.Events {
				if ev.Name == unitPath && ev.Has(fsnotify.Create) {
					seen <- time.Now()
				}
			}
		}()
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			cl, t0, err := claimUnit(fdir, 0)
			if err != nil {
				b.Fatal(err)
			}
			select {
			case t := <-seen:
				lat = append(lat, t.Sub(t0))
			case <-time.After(10 * time.Second):
				b.Fatal("the watcher did not see the claim")
			}
			b.StopTimer()
			if err := cl.release(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		b.StopTimer()
		reportLatencies(b, "", lat)
	})

	b.Run("gpuletd", func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		rel := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			cl, t0, err := claimUnit(dir, 0)
			if err != nil {
				b.Fatal(err)
			}
			t := pollUntil(b, c, 10*time.Second, "the claim counted", func(s *api.Snapshot) bool { return offline(s) == 1 })
			lat = append(lat, t.Sub(t0))
			// Releasing and waiting for the count to drop readies the next
			// iteration; it is measured too, but not in ns/op.
			b.StopTimer()
			t1 := time.Now()
			if err := cl.release(); err != nil {
				b.Fatal(err)
			}
			t = pollUntil(b, c, 10*time.Second, "the released claim gone", func(s *api.Snapshot) bool { return offline(s) == 0 })
			rel = append(rel, t.Sub(t1))
			b.StartTimer()
		}
		b.StopTimer()
		reportLatencies(b, "", lat)
		reportLatencies(b, "release-", rel)
	})
}

// burstClaims is the size of BenchmarkOfflineBurst's burst.
const (
	burstGPUs       = 2
	burstPerGPU     = 5000
	burstClaims     = burstGPUs * burstPerGPU
	burstFDHeadroom = 512
	// maxBursts bounds the iterations of BenchmarkOfflineBurst, whose every
	// iteration takes seconds, against a -benchtime=Nx meant for the others.
	maxBursts = 50
)

// raiseNOFILE lifts this process's soft RLIMIT_NOFILE to want when the hard
// limit allows (Go already raises the soft limit to the hard one at start on
// Linux; this is for a runtime that did not) and skips the benchmark when not.
func raiseNOFILE(b *testing.B, want uint64) {
	b.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		b.Fatal(err)
	}
	if rl.Cur >= want {
		return
	}
	if rl.Max < want {
		b.Skipf("RLIMIT_NOFILE hard limit %d is below the %d descriptors the burst holds; raise it (ulimit -Hn) to run this benchmark", rl.Max, want)
	}
	rl.Cur = want
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkOfflineBurst makes 10,000 offline claims as fast as this process
// can (one goroutine per GPU, 5,000 units each, every descriptor held here)
// and measures claim-ms, the claimers' own time from the first link(2) to the
// last (the floor: no counter can finish before it); counted-ms, from the
// first link(2) to the first snapshot that counts all 10,000; and lag-ms, from
// the last link(2) to that snapshot, the time gpuletd needs beyond the
// claimers. overflows/op says how often gpuletd's inotify queue overflowed in
// a burst (it then lists the ledger again). gpuletd must survive and count
// exactly 10,000, also after it probed every claim; held-leases-max-ms is the
// slowest GET /v1/leases (which waits for the lease table's lock, as every
// lease and release does) over the 2.5s the claims are held after the first
// burst, two sample intervals with a probe of every claim each.
func BenchmarkOfflineBurst(b *testing.B) {
	raiseNOFILE(b, burstClaims+burstFDHeadroom)
	d := startDaemon(b, "--sim-gpus", fmt.Sprintf("%dxA100-80GB", burstGPUs), "--clients-per-instance", strconv.Itoa(burstPerGPU), "--units-per-gpu", strconv.Itoa(burstPerGPU))
	dirs := instanceDirs(b, d.RunDir)
	if len(dirs) != burstGPUs {
		b.Fatalf("layout has %d GPUs, want %d", len(dirs), burstGPUs)
	}
	c := httpClient(d.Socket)
	defer c.CloseIdleConnections()
	if s, err := snapshot(c); err != nil || s.UnitsTotal != burstClaims {
		b.Fatalf("snapshot %+v, %v: want %d units in all", s, err, burstClaims)
	}
	// all holds when the snapshot counts every claim, and fails the benchmark
	// when it counts more; none holds when it counts none.
	all := func(tb testing.TB) func(*api.Snapshot) bool {
		return func(s *api.Snapshot) bool {
			if n := offline(s); n > burstClaims || burstClaims-s.UnitsFree > burstClaims {
				tb.Fatalf("snapshot counts %d offline claims and %d units used, more than the %d claims made", n, burstClaims-s.UnitsFree, burstClaims)
			}
			return offline(s) == burstClaims && s.UnitsFree == 0
		}
	}
	none := func(s *api.Snapshot) bool { return offline(s) == 0 && s.UnitsFree == burstClaims }
	b.Run("claims=10000", func(b *testing.B) {
		if b.N > maxBursts {
			b.Skipf("one iteration is a whole burst of a second or more; -benchtime=%dx asks for %d of them: use a time-based -benchtime (the default 1s runs one)", b.N, b.N)
		}
		var claimT, countedT, lagT []time.Duration
		var held []claim
		heldChecked := false
		lost := func() int { return strings.Count(d.Log.String(), "events lost") }
		lost0 := lost()
		for range b.N {
			b.StopTimer()
			claims := make([][]claim, burstGPUs)
			first := make([]time.Time, burstGPUs)
			last := make([]time.Time, burstGPUs)
			errs := make([]error, burstGPUs)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for g := range burstGPUs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					claims[g] = make([]claim, 0, burstPerGPU)
					<-start
					for i := range burstPerGPU {
						cl, t0, err := claimUnit(dirs[g], i)
						if err != nil {
							errs[g] = err
							return
						}
						if i == 0 {
							first[g] = t0
						}
						claims[g] = append(claims[g], cl)
					}
					last[g] = time.Now()
				}()
			}
			b.StartTimer()
			close(start)
			wg.Wait()
			held = slices.Concat(claims...)
			if err := errors.Join(errs...); err != nil {
				b.Fatal(err)
			}
			t := pollUntil(b, c, time.Minute, "all 10,000 claims counted", all(b))
			b.StopTimer()
			t0 := slices.MinFunc(first, func(a, b time.Time) int { return a.Compare(b) })
			t1 := slices.MaxFunc(last, func(a, b time.Time) int { return a.Compare(b) })
			claimT = append(claimT, t1.Sub(t0))
			countedT = append(countedT, t.Sub(t0))
			lagT = append(lagT, t.Sub(t1))

			// Once, hold them across two sample intervals: gpuletd probes
			// every claim then and must keep all 10,000, and stay up. Meanwhile
			// GET /v1/leases, which waits for the lease table's lock as every
			// lease and release does, shows how long the probe holds it.
			if !heldChecked {
				heldChecked = true
				stall := lockStall(b, c, 2500*time.Millisecond)
				pollUntil(b, c, 10*time.Second, "all 10,000 claims still counted after a probe", all(b))
				b.ReportMetric(float64(stall)/float64(time.Millisecond), "held-leases-max-ms")
			}

			for _, cl := range held {
				if err := cl.release(); err != nil {
					b.Fatal(err)
				}
			}
			held = nil
			pollUntil(b, c, time.Minute, "all claims released", none)
		}
		report := func(name string, d []time.Duration) {
			slices.Sort(d)
			b.ReportMetric(float64(d[len(d)/2])/float64(time.Millisecond), name)
		}
		report("claim-ms", claimT)
		report("counted-ms", countedT)
		report("lag-ms", lagT)
		b.ReportMetric(float64(lost()-lost0)/float64(b.N), "overflows/op")
	})
}

// lockStall GETs /v1/leases in a loop for d and returns the slowest answer.
func lockStall(b *testing.B, c *http.Client, d time.Duration) time.Duration {
	b.Helper()
	var worst time.Duration
	for end := time.Now().Add(d); time.Now().Before(end); {
		t0 := time.Now()
		resp, err := c.Get("http://gpulet/v1/leases")
		if err != nil {
			b.Fatal(err)
		}
		drain(resp)
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("GET /v1/leases: HTTP %d", resp.StatusCode)
		}
		worst = max(worst, time.Since(t0))
	}
	return worst
}
