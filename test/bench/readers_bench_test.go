package bench

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpulet/gpulet/internal/e2e"
)

// BenchmarkLeaseUnderReaders is lease+release at 8 clients on gpuletd while 8
// readers hammer GET /v1/snapshot, in alternating turns: in one turn the
// readers read gpuletd's snapshot, in the other the very same bytes from
// floor-proc, a process of its own. The readers cost the machine the same
// CPU either way, so what the ratio shows is what reading gpuletd's snapshot
// does to its leasing beyond that: with readers that never take the lease
// table's lock it stays near 1. Reported: x-readers-p99 and x-readers-ops,
// the turns with readers on gpuletd against those with readers on the floor.
func BenchmarkLeaseUnderReaders(b *testing.B) {
	d := startDaemon(b, "--clients-per-instance", "64", "--units-per-gpu", "64")
	body, err := d.Client.SnapshotJSON(e2e.Ctx(b))
	if err != nil {
		b.Fatal(err)
	}
	floorSock := floorProcess(b, body, nil)
	const clients, readers = 8, 8
	per := max(b.N/clients, 1)
	onDaemon, onFloor := newTeam(d.Socket, clients, per), newTeam(d.Socket, clients, per)
	defer onDaemon.close()
	defer onFloor.close()
	var daemonTime, floorTime time.Duration
	var reads atomic.Int64
	b.ResetTimer()
	for done, round := 0, 0; done < per; done, round = done+pairedTurn, round+1 {
		n := min(pairedTurn, per-done)
		sides := []struct {
			t       *team
			sock    string
			elapsed *time.Duration
		}{{onFloor, floorSock, &floorTime}, {onDaemon, d.Socket, &daemonTime}}
		if round%2 == 1 {
			sides[0], sides[1] = sides[1], sides[0]
		}
		for _, side := range sides {
			stop := hammer(b, side.sock, readers, &reads)
			elapsed, err := side.t.turn(n, leaseRelease)
			stop()
			if err != nil {
				b.Fatal(err)
			}
			*side.elapsed += elapsed
		}
	}
	b.StopTimer()
	f := onFloor.report(b, "floor-", floorTime)
	reportRatio(b, onDaemon.report(b, "", daemonTime), f, "readers")
	b.ReportMetric(float64(reads.Load())/(daemonTime+floorTime).Seconds(), "reads/s")
}

// hammer starts readers goroutines reading GET /v1/snapshot from sock as fast
// as they can, counting reads, until the returned stop is called.
func hammer(b *testing.B, sock string, readers int, reads *atomic.Int64) (stop func()) {
	var wg sync.WaitGroup
	var halt atomic.Bool
	for range readers {
		c := httpClient(sock)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.CloseIdleConnections()
			for !halt.Load() {
				if err := getSnapshot(c); err != nil {
					b.Error(err)
					return
				}
				reads.Add(1)
			}
		}()
	}
	return func() {
		halt.Store(true)
		wg.Wait()
	}
}
