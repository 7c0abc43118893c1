package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// BenchmarkLeaseUnderReaders is lease+release at 8 clients on gpuletd while 8
// readers read the node's state, in alternating turns: in one turn the
// readers read gpuletd, in the other the very same bytes from a floor, a
// process of its own. The readers cost the machine about the same CPU either
// way, so what the ratio shows is what reading gpuletd does to its leasing
// beyond that: with readers that never take the lease table's lock it stays
// near 1. Reported: x-readers-p99 and x-readers-ops, the turns with readers
// on gpuletd against those with readers on the floor, and reads/s,
// floor-reads/s and their ratio x-floor-reads.
//
//   - api: the readers GET /v1/snapshot; the floor is floor-proc.
//   - api-held=10000: the same on a 16-GPU node with 10,000 leases held all
//     along, so that a snapshot made for a reader after each change has a
//     large table behind it.
//   - view: the readers open, read and close free_units and snapshot.json on
//     gpuletd's FUSE view, served by its view process as gpuletd runs it by
//     default, as scripts do; the floor is a go-fuse file system of those two
//     files in floor-proc's process. It needs a real mount (root, or
//     fusermount3) and skips itself, saying why, without one.
//
// In the parts named so, readers read as fast as they can: a side that
// serves reads slower is then also read less, and has less to do, which
// raises its ratio. In each /paced part every reader reads once every
// readerPace (2,000 reads a second in all), so that both turns carry the
// same read load; the goals are judged on these, in the runs where gpuletd's
// readers read at least 0.95 times as often as the floor's (x-floor-reads).
func BenchmarkLeaseUnderReaders(b *testing.B) {
	b.Run("api", func(b *testing.B) { leaseUnderReaders(b, 0, false, 0) })
	b.Run("api/paced", func(b *testing.B) { leaseUnderReaders(b, 0, false, readerPace) })
	b.Run("api-held=10000", func(b *testing.B) { leaseUnderReaders(b, 10000, false, 0) })
	b.Run("api-held=10000/paced", func(b *testing.B) { leaseUnderReaders(b, 10000, false, readerPace) })
	b.Run("view", func(b *testing.B) { leaseUnderReaders(b, 0, true, 0) })
	b.Run("view/paced", func(b *testing.B) { leaseUnderReaders(b, 0, true, readerPace) })
}

// readerPace is how often each paced reader reads: 8 readers at 4 ms are
// 2,000 reads a second, under half of what gpuletd serves to unpaced ones
// with 10,000 leases held, so that both sides keep the pace.
const readerPace = 4 * time.Millisecond

// leaseUnderReaders runs the benchmark; pace, when not 0, is how often each
// reader reads (0: as fast as it can).
func leaseUnderReaders(b *testing.B, held int, view bool, pace time.Duration) {
	// Enough units for the leases held and the 8 clients' churn, in one MPS
	// instance per GPU: two GPUs with nothing held; with leases held, a
	// 16-GPU node, as in the placement benchmark (BenchmarkPlace).
	gpus := 2
	if held > 0 {
		gpus = 16
	}
	units := strconv.Itoa(64 + held/gpus)
	flags := []string{"--sim-gpus", fmt.Sprintf("%dxA100-80GB", gpus), "--clients-per-instance", units, "--units-per-gpu", units}
	var viewDir, floorDir string
	if view {
		requireFUSE(b)
		viewDir, floorDir = b.TempDir(), b.TempDir()
		flags = append(flags, "--mount", viewDir)
	}
	d := startDaemon(b, flags...)
	holdLeases(b, d.Socket, held)
	body, err := d.Client.SnapshotJSON(e2e.Ctx(b))
	if err != nil {
		b.Fatal(err)
	}
	var daemonReader, floorReader func() reader
	if view {
		// Registered first, so that it runs after the floor process is
		// killed: a mount whose server is gone stays until unmounted.
		b.Cleanup(func() { syscall.Unmount(floorDir, syscall.MNT_DETACH) })
		startFloorProcess(b, body, nil, floorMountEnv+"="+floorDir)
		waitForFile(b, filepath.Join(viewDir, "free_units"))
		waitForFile(b, filepath.Join(floorDir, "free_units"))
		daemonReader, floorReader = fileReader(viewDir), fileReader(floorDir)
	} else {
		floorSock := floorProcess(b, body, nil)
		daemonReader, floorReader = snapshotReader(d.Socket), snapshotReader(floorSock)
	}
	const clients, readers = 8, 8
	per := max(b.N/clients, 1)
	onDaemon, onFloor := newTeam(d.Socket, clients, per), newTeam(d.Socket, clients, per)
	defer onDaemon.close()
	defer onFloor.close()
	var daemonTime, floorTime time.Duration
	var daemonReads, floorReads atomic.Int64
	b.ResetTimer()
	for done, round := 0, 0; done < per; done, round = done+pairedTurn, round+1 {
		n := min(pairedTurn, per-done)
		sides := []struct {
			t       *team
			readers func() reader
			elapsed *time.Duration
			reads   *atomic.Int64
		}{{onFloor, floorReader, &floorTime, &floorReads}, {onDaemon, daemonReader, &daemonTime, &daemonReads}}
		if round%2 == 1 {
			sides[0], sides[1] = sides[1], sides[0]
		}
		for _, side := range sides {
			stop := hammer(b, side.readers, readers, pace, side.reads)
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
	reads, floorReadRate := float64(daemonReads.Load())/daemonTime.Seconds(), float64(floorReads.Load())/floorTime.Seconds()
	b.ReportMetric(reads, "reads/s")
	b.ReportMetric(floorReadRate, "floor-reads/s")
	b.ReportMetric(reads/floorReadRate, "x-floor-reads")
}

// reader reads the node's state once per call of read; close lets go of what
// it holds.
type reader struct {
	read  func() error
	close func()
}

// snapshotReader makes readers of GET /v1/snapshot on sock, each with its own
// keep-alive client.
func snapshotReader(sock string) func() reader {
	return func() reader {
		c := httpClient(sock)
		return reader{read: func() error { return getSnapshot(c) }, close: c.CloseIdleConnections}
	}
}

// viewFiles are what fileReader reads, in turn: the one-number file scripts
// read most, and the whole snapshot.
var viewFiles = []string{"free_units", "snapshot.json"}

// fileReader makes readers that open, read to the end and close each of
// viewFiles under dir in turn, as `cat` does.
func fileReader(dir string) func() reader {
	return func() reader {
		buf := make([]byte, 64<<10)
		i := 0
		return reader{read: func() error {
			i = (i + 1) % len(viewFiles)
			_, err := readFile(filepath.Join(dir, viewFiles[i]), buf)
			return err
		}, close: func() {}}
	}
}

// readFile reads path with open, read and close alone, into buf.
func readFile(path string, buf []byte) (int, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", path, err)
	}
	defer syscall.Close(fd)
	total := 0
	for {
		n, err := syscall.Read(fd, buf[total:])
		if err != nil {
			return total, fmt.Errorf("read %s: %w", path, err)
		}
		if n == 0 {
			return total, nil
		}
		if total += n; total == len(buf) {
			return total, fmt.Errorf("read %s: larger than %d bytes", path, len(buf))
		}
	}
}

// hammer starts readers goroutines, each reading through a reader of its own
// from newReader, counting reads, until the returned stop is called. Each
// reads as fast as it can, or, when pace is not 0, once every pace: a reader
// that falls behind reads at once, without making up the reads it missed.
func hammer(b *testing.B, newReader func() reader, readers int, pace time.Duration, reads *atomic.Int64) (stop func()) {
	var wg sync.WaitGroup
	var halt atomic.Bool
	for i := range readers {
		r := newReader()
		// Paced readers start spread over one pace, not all at once.
		next := time.Now().Add(pace * time.Duration(i) / time.Duration(readers))
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer r.close()
			for !halt.Load() {
				if pace > 0 {
					time.Sleep(time.Until(next))
					if next = next.Add(pace); next.Before(time.Now()) {
						next = time.Now()
					}
					if halt.Load() {
						return
					}
				}
				if err := r.read(); err != nil {
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

// holdLeases takes n one-unit leases with an hour's ttl on the gpuletd at
// sock, 8 at a time, and keeps them for the rest of the benchmark.
func holdLeases(b *testing.B, sock string, n int) {
	b.Helper()
	if n == 0 {
		return
	}
	const parallel = 8
	errs := make(chan error, parallel)
	for w := range parallel {
		go func() {
			c := httpClient(sock)
			defer c.CloseIdleConnections()
			for i := w; i < n; i += parallel {
				resp, err := c.Post("http://gpulet/v1/leases", "application/json", strings.NewReader(`{"units":1,"ttl":"1h"}`))
				if err != nil {
					errs <- err
					return
				}
				drain(resp)
				if resp.StatusCode != http.StatusCreated {
					errs <- fmt.Errorf("holding lease %d: HTTP %d", i, resp.StatusCode)
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
		b.Fatal(err)
	}
}

// waitForFile waits until path can be read (a view answers once mounted and
// given its first snapshot).
func waitForFile(b testing.TB, path string) {
	b.Helper()
	buf := make([]byte, 64<<10)
	testutil.Eventually(b, path+" to be readable", func() bool {
		_, err := readFile(path, buf)
		return err == nil
	})
}

// requireFUSE skips b, saying why, where the FUSE floor cannot be mounted:
// it mounts directly, which needs root.
func requireFUSE(b testing.TB) {
	b.Helper()
	e2e.RequireFUSE(b)
	if os.Geteuid() != 0 {
		b.Skip("no real mount: the view floor mounts directly, which needs root")
	}
}

// floorMountEnv names the folder where the floor process also mounts the FUSE
// floor: a go-fuse file system of the view's free_units and snapshot.json,
// with the bytes gpuletd served. It caches what the view caches (the names,
// whose entries the kernel keeps an hour) and nothing else: attributes are
// asked for again and the bytes are rendered at open with direct I/O, as the
// view serves files that change.
const floorMountEnv = "GPULET_BENCH_FLOOR_MOUNT"

// mountFloorView mounts the FUSE floor at dir with snapshot (a snapshot's
// JSON) as snapshot.json and its units_free as free_units; the process
// serves it until it is killed.
func mountFloorView(dir string, snapshot []byte) error {
	var s api.Snapshot
	if err := json.Unmarshal(snapshot, &s); err != nil {
		return fmt.Errorf("floor view: %w", err)
	}
	files := map[string][]byte{
		"free_units":    []byte(strconv.Itoa(s.UnitsFree) + "\n"),
		"snapshot.json": snapshot,
	}
	root := &fs.Inode{}
	names, attrs := time.Hour, time.Duration(0)
	_, err := fs.Mount(dir, root, &fs.Options{
		EntryTimeout: &names, AttrTimeout: &attrs,
		MountOptions: fuse.MountOptions{
			DirectMount: true, AllowOther: true, DisableXAttrs: true,
			Options: []string{"ro", "default_permissions"},
		},
		OnAdd: func(ctx context.Context) {
			for name, data := range files {
				f := root.NewPersistentInode(ctx, &floorFile{data: data}, fs.StableAttr{Mode: syscall.S_IFREG})
				root.AddChild(name, f, true)
			}
		},
	})
	return err
}

// floorFile is the smallest go-fuse file rendered at open: fixed bytes, read
// only, direct I/O, nothing else.
type floorFile struct {
	fs.Inode
	data []byte
}

var (
	_ fs.NodeOpener    = (*floorFile)(nil)
	_ fs.NodeGetattrer = (*floorFile)(nil)
)

func (f *floorFile) Open(context.Context, uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return floorHandle(f.data), fuse.FOPEN_DIRECT_IO, 0
}

func (f *floorFile) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o444
	out.Size = uint64(len(f.data))
	return 0
}

type floorHandle []byte

func (h floorHandle) Read(_ context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	end := min(off+int64(len(dest)), int64(len(h)))
	return fuse.ReadResultData(h[min(off, end):end]), 0
}

// The FUSE floor serves snapshot.json and free_units with the bytes it was
// given.
func TestFUSEFloor(t *testing.T) {
	requireFUSE(t)
	body := []byte(`{"schema":"gpulet.snapshot/v1","units_total":32,"units_free":29,"gpus":[]}` + "\n")
	dir := t.TempDir()
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	startFloorProcess(t, body, nil, floorMountEnv+"="+dir)
	waitForFile(t, filepath.Join(dir, "free_units"))
	buf := make([]byte, 4096)
	for name, want := range map[string]string{"free_units": "29\n", "snapshot.json": string(body)} {
		n, err := readFile(filepath.Join(dir, name), buf)
		if err != nil || string(buf[:n]) != want {
			t.Errorf("%s = %q, %v; want %q", name, buf[:n], err, want)
		}
	}
}
