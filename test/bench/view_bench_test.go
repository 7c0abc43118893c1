package bench

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/test/e2e"
)

// BenchmarkViewRead is what `cat free_units` costs on gpuletd's FUSE view as
// gpuletd runs it by default: the view served by a process of its own, which
// asks gpuletd's API for the current snapshot on each open. One reader opens,
// reads to the end and closes free_units, in alternating turns of pairedTurn
// reads on the view and on the floor: a go-fuse file system of the same file
// with the bytes gpuletd served, in a process of its own (floor-proc's), that
// caches what the view caches and renders the bytes at open with direct I/O,
// as the view does. Reported: p50-ns and p99-ns of the view, floor-p50-ns and
// floor-p99-ns of the floor, and x-floor-p50 and x-floor-p99. It needs a real
// mount and skips itself, saying why, without one.
//
// fsview's BenchmarkReadFreeUnits measures the view over a snapshot in the
// benchmark's memory, which no gpuletd runs since the view has its own
// process; this one is the path production takes.
func BenchmarkViewRead(b *testing.B) {
	b.Run("paired", func(b *testing.B) {
		requireFUSE(b)
		viewDir, floorDir := b.TempDir(), b.TempDir()
		d := startDaemon(b, "--mount", viewDir)
		body, err := d.Client.SnapshotJSON(e2e.Ctx(b))
		if err != nil {
			b.Fatal(err)
		}
		// Registered first, so that it runs after the floor process is
		// killed: a mount whose server is gone stays until unmounted.
		b.Cleanup(func() { syscall.Unmount(floorDir, syscall.MNT_DETACH) })
		startFloorProcess(b, body, nil, floorMountEnv+"="+floorDir)
		view, floor := filepath.Join(viewDir, "free_units"), filepath.Join(floorDir, "free_units")
		waitForFile(b, view)
		waitForFile(b, floor)
		buf := make([]byte, 4096)
		want, err := readFile(floor, buf)
		if err != nil {
			b.Fatal(err)
		}
		onView, onFloor := make([]time.Duration, 0, b.N/2+pairedTurn), make([]time.Duration, 0, b.N/2+pairedTurn)
		readTurn := func(path string, n int, into *[]time.Duration) {
			for range n {
				t0 := time.Now()
				got, err := readFile(path, buf)
				*into = append(*into, time.Since(t0))
				if err != nil || got != want {
					b.Fatalf("%s: %d bytes, %v; want %d", path, got, err, want)
				}
			}
		}
		b.ResetTimer()
		for done, round := 0, 0; done < b.N; done, round = done+2*pairedTurn, round+1 {
			n := max(min(pairedTurn, (b.N-done)/2), 1)
			if round%2 == 0 {
				readTurn(floor, n, &onFloor)
				readTurn(view, n, &onView)
			} else {
				readTurn(view, n, &onView)
				readTurn(floor, n, &onFloor)
			}
		}
		b.StopTimer()
		fp50, fp99 := reportLatencies(b, "floor-", onFloor)
		p50, p99 := reportLatencies(b, "", onView)
		b.ReportMetric(float64(p50)/float64(fp50), "x-floor-p50")
		b.ReportMetric(float64(p99)/float64(fp99), "x-floor-p99")
	})
}
