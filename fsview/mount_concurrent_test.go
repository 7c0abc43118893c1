package fsview

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/snapshot"
)

// TestMountConcurrentReaders reads files from several goroutines while another
// stores new snapshots as fast as it can. Every read must be one whole snapshot,
// and a reader must never see an older snapshot after a newer one.
func TestMountConcurrentReaders(t *testing.T) {
	var store snapshot.Store
	store.Store(concurrentSnapshot(t, 1))
	_, dir := mountView(t, &store)

	var stop atomic.Bool
	var stored atomic.Uint64
	var wg sync.WaitGroup
	wg.Go(func() {
		for seq := uint64(2); !stop.Load(); seq++ {
			store.Store(concurrentSnapshot(t, seq))
			stored.Store(seq)
		}
	})

	const readers = 4
	seen := make([]map[uint64]bool, readers)
	for r := range readers {
		seen[r] = map[uint64]bool{}
		wg.Go(func() {
			var lastSeq, lastMetricsSeq uint64
			for !stop.Load() {
				b, err := os.ReadFile(filepath.Join(dir, "snapshot.json"))
				if err != nil {
					t.Error(err)
					return
				}
				var s api.Snapshot
				if err := json.Unmarshal(b, &s); err != nil || s.UnitsFree != int(s.Seq%29) {
					t.Errorf("snapshot.json: %v, seq %d units_free %d: %q", err, s.Seq, s.UnitsFree, b)
					return
				}
				if s.Seq < lastSeq {
					t.Errorf("snapshot.json went back from seq %d to %d", lastSeq, s.Seq)
				}
				lastSeq = s.Seq
				seen[r][s.Seq] = true

				var free, seq uint64
				b, err = os.ReadFile(filepath.Join(dir, "metrics"))
				if _, serr := fmt.Sscanf(string(b), "gpulet_units_free %d\ngpulet_seq %d\n", &free, &seq); err != nil || serr != nil || free != seq%29 {
					t.Errorf("metrics: %v %v %q", err, serr, b)
					return
				}
				if seq < lastMetricsSeq {
					t.Errorf("metrics went back from seq %d to %d", lastMetricsSeq, seq)
				}
				lastMetricsSeq = seq

				for _, path := range []string{"free_units", "gpus/0/units_free", "gpus/GPU-aaaa/units_used"} {
					b, err := os.ReadFile(filepath.Join(dir, path))
					v, perr := strconv.Atoi(strings.TrimSuffix(string(b), "\n"))
					if err != nil || perr != nil || v < 0 || v > 28 || !strings.HasSuffix(string(b), "\n") {
						t.Errorf("%s: %v %q", path, err, b)
						return
					}
				}

				ents, err := os.ReadDir(filepath.Join(dir, "leases"))
				if err != nil {
					t.Error(err)
					return
				}
				for _, e := range ents {
					b, err := os.ReadFile(filepath.Join(dir, "leases", e.Name()))
					if errors.Is(err, fs.ErrNotExist) {
						continue // released since the listing
					}
					var l api.Lease
					if err != nil || json.Unmarshal(b, &l) != nil || l.ID != e.Name() {
						t.Errorf("leases/%s: %v %q", e.Name(), err, b)
						return
					}
				}
			}
		})
	}
	// Not a wait for something to happen: the readers race the writer for
	// this long, the more reads the more chances of a torn or stale one.
	time.Sleep(time.Second)
	stop.Store(true)
	wg.Wait()

	for r := range readers {
		if len(seen[r]) < 2 {
			t.Errorf("reader %d saw %d snapshots, want it to follow the store", r, len(seen[r]))
		}
	}
	t.Logf("stored %d snapshots; readers saw %d, %d, %d, %d of them",
		stored.Load(), len(seen[0]), len(seen[1]), len(seen[2]), len(seen[3]))

	last := concurrentSnapshot(t, stored.Load()+1)
	store.Store(last)
	if got := readFile(t, filepath.Join(dir, "snapshot.json")); got != string(last.JSON()) {
		t.Errorf("after the writer stopped, snapshot.json is not the last stored")
	}
}

// concurrentSnapshot derives every value from seq so that readers can check a
// read against itself.
func concurrentSnapshot(tb testing.TB, seq uint64) *snapshot.Published {
	s := testSnapshot(seq, int(seq%29))
	s.GPUs[0].UnitsFree = int(seq % 17)
	s.GPUs[0].UnitsUsed = 16 - int(seq%17)
	var leases []api.Lease
	if seq%2 == 1 {
		leases = append(leases, testLease(fmt.Sprintf("lease-%d", seq), leaseOwner()))
	}
	return snapshot.New(s, func() []api.Lease { return leases }, testMetrics)
}

// TestMountOpenFileSizeIsItsBytes: an open file's size is that of the bytes
// rendered at its open, not the size in a newer snapshot, so that a reader
// sizing by fstat or lseek(SEEK_END) (tail -n, wc -c) gets them whole.
func TestMountOpenFileSizeIsItsBytes(t *testing.T) {
	var store snapshot.Store
	store.Store(publish(t, testSnapshot(1, 5)))
	_, dir := mountView(t, &store)
	f, err := os.Open(filepath.Join(dir, "free_units"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	store.Store(publish(t, testSnapshot(2, 12345)))
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		t.Fatal(err)
	}
	f.Seek(0, io.SeekStart)
	b, _ := io.ReadAll(f)
	if string(b) != "5\n" || st.Size() != int64(len(b)) || end != int64(len(b)) {
		t.Errorf("open file reads %q but fstat says %d bytes and SEEK_END %d", b, st.Size(), end)
	}
	if out, err := exec.Command("tail", "-n1", filepath.Join(dir, "free_units")).Output(); err == nil && string(out) != "12345\n" {
		t.Errorf("tail -n1 free_units = %q, want 12345", out)
	}
	// Where the kernel names no file, go-fuse passes the one still open:
	// once it is older than a stat may be, the stat is the snapshot's.
	time.Sleep(latestFor)
	if st, err := os.Stat(filepath.Join(dir, "free_units")); err != nil || st.Size() != int64(len("12345\n")) {
		t.Errorf("stat free_units while an old open of it is held: %v, %v; want 6 bytes", st.Size(), err)
	}
}
