package fsview

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/snapshot"
)

var testTime = time.Date(2026, 11, 22, 17, 0, 0, 0, time.UTC)

func testMetrics(s *api.Snapshot) []byte {
	return fmt.Appendf(nil, "gpulet_units_free %d\ngpulet_seq %d\n", s.UnitsFree, s.Seq)
}

// testSnapshot is a two-GPU node with unitsFree free units.
func testSnapshot(seq uint64, unitsFree int) *api.Snapshot {
	return &api.Snapshot{
		Schema:        api.SnapshotSchema,
		Node:          "host1",
		BootID:        "boot-1",
		Seq:           seq,
		Time:          testTime.Add(time.Duration(seq) * time.Second),
		State:         api.NodeWorking,
		Backend:       api.BackendSimulated,
		MPS:           "on",
		UnitsTotal:    32,
		UnitsFree:     unitsFree,
		UnitsReserved: 2,
		Reservations: []api.ReservationStatus{{Name: "wf1", State: api.ReservationActive, Priority: 10, Reserved: 8,
			Stage: 1, Stages: 4, Need: 6, InUse: 6, Lendable: 2, Lent: 2, Reclaimed: 4}},
		GPUs: []api.GPU{
			{
				Index: 0, UUID: "GPU-aaaa", Name: "NVIDIA A100-SXM4-80GB", State: api.GPUWorking,
				Eligible: true, UnitsTotal: 16, UnitsUsed: 4, UnitsFree: 10, UnitsOffline: 1, UnitsReserved: 2,
				UtilizationPct: 37, MaxUtilizationPct: 90, MemoryTotalMiB: 81920, MemoryUsedMiB: 20000,
			},
			{
				Index: 1, UUID: "GPU-bbbb", Name: "Tesla T4", State: api.GPUDegraded,
				Eligible: false, UnitsTotal: 16, UnitsFree: 16,
				MemoryTotalMiB: 15360,
			},
		},
	}
}

func testLease(id string, uid uint32) api.Lease {
	return api.Lease{
		ID:       id,
		GPU:      api.LeaseGPU{Index: 0, UUID: "GPU-aaaa"},
		Units:    []int{0, 1},
		Owner:    api.Owner{UID: uid, GID: uid, PID: 42},
		Created:  testTime,
		TTL:      "1h",
		Labels:   map[string]string{"team": "a"},
		Env:      map[string]string{"CUDA_MPS_PIPE_DIRECTORY": "/run/gpulet/mps/0/0"},
		Instance: 0,
	}
}

// publish makes a Published of s and leases, sorted by ID as the agent's are
// (stably, so that of two leases with one ID the first given stays first).
func publish(tb testing.TB, s *api.Snapshot, leases ...api.Lease) *snapshot.Published {
	tb.Helper()
	slices.SortStableFunc(leases, func(a, b api.Lease) int { return strings.Compare(a.ID, b.ID) })
	return snapshot.New(s, func() []api.Lease { return leases }, testMetrics)
}

// layoutCase is one file of the layout and the bytes it must hold.
type layoutCase struct {
	path string
	want string
}

// layoutCases lists every file of the layout for the snapshot
// publish(testSnapshot(7, 28), testLease("lease-1", uid)).
func layoutCases(p *snapshot.Published, uid uint32) []layoutCase {
	lease := fmt.Sprintf(`{"id":"lease-1","gpu":{"index":0,"uuid":"GPU-aaaa"},"instance":0,"units":[0,1],`+
		`"owner":{"uid":%d,"gid":%[1]d,"pid":42},"created":"2026-11-22T17:00:00Z","ttl":"1h",`+
		`"preemptible":false,"labels":{"team":"a"},"env":{"CUDA_MPS_PIPE_DIRECTORY":"/run/gpulet/mps/0/0"}}`+"\n", uid)
	return []layoutCase{
		{"free_units", "28\n"},
		{"total_units", "32\n"},
		{"reserved_units", "2\n"},
		{"state", "working\n"},
		{"snapshot.json", string(p.JSON())},
		{"metrics", "gpulet_units_free 28\ngpulet_seq 7\n"},
		{"gpus/0/uuid", "GPU-aaaa\n"},
		{"gpus/0/name", "NVIDIA A100-SXM4-80GB\n"},
		{"gpus/0/state", "working\n"},
		{"gpus/0/eligible", "true\n"},
		{"gpus/0/units_total", "16\n"},
		{"gpus/0/units_used", "4\n"},
		{"gpus/0/units_free", "10\n"},
		{"gpus/0/units_offline", "1\n"},
		{"gpus/0/units_reserved", "2\n"},
		{"gpus/0/utilization_pct", "37\n"},
		{"gpus/0/memory_used_mib", "20000\n"},
		{"gpus/0/memory_total_mib", "81920\n"},
		{"gpus/1/uuid", "GPU-bbbb\n"},
		{"gpus/1/name", "Tesla T4\n"},
		{"gpus/1/state", "degraded\n"},
		{"gpus/1/eligible", "false\n"},
		{"gpus/1/units_total", "16\n"},
		{"gpus/1/units_used", "0\n"},
		{"gpus/1/units_free", "16\n"},
		{"gpus/1/units_offline", "0\n"},
		{"gpus/1/units_reserved", "0\n"},
		{"gpus/1/utilization_pct", "0\n"},
		{"gpus/1/memory_used_mib", "0\n"},
		{"gpus/1/memory_total_mib", "15360\n"},
		{"leases/lease-1", lease},
		{"reservations/wf1", `{"name":"wf1","state":"active","priority":10,"reserved":8,"stage":1,"stages_total":4,"need":6,"in_use":6,"lendable":2,"lent":2,"reclaimed":4}` + "\n"},
	}
}

func TestRender(t *testing.T) {
	p := publish(t, testSnapshot(7, 28), testLease("lease-1", 1000))
	for _, tc := range layoutCases(p, 1000) {
		t.Run(tc.path, func(t *testing.T) {
			got, ok := render(p, tc.path)
			if !ok {
				t.Fatalf("render(%q) found nothing", tc.path)
			}
			if string(got) != tc.want {
				t.Errorf("render(%q) = %q, want %q", tc.path, got, tc.want)
			}
		})
	}
}

func TestRenderSnapshotJSONIsPublishedBytes(t *testing.T) {
	p := publish(t, testSnapshot(7, 28))
	got, _ := render(p, "snapshot.json")
	if &got[0] != &p.JSON()[0] {
		t.Error("snapshot.json is a copy, want Published.JSON itself")
	}
}

func TestLookupEntries(t *testing.T) {
	p := publish(t, testSnapshot(7, 28), testLease("lease-1", 1000))
	tests := []struct {
		name string
		path string
		want entry
	}{
		{"root", "", entry{kind: kindDir, perm: 0o555, static: true}},
		{"gpus", "gpus", entry{kind: kindDir, perm: 0o555, static: true}},
		{"leases", "leases", entry{kind: kindDir, perm: 0o555, static: true}},
		{"gpu dir", "gpus/1", entry{kind: kindDir, perm: 0o555}},
		{"uuid link", "gpus/GPU-bbbb", entry{kind: kindLink, data: []byte("1"), perm: 0o777}},
		{"root file", "free_units", entry{kind: kindFile, data: []byte("28\n"), perm: 0o444, static: true}},
		{"gpu file", "gpus/0/units_free", entry{kind: kindFile, data: []byte("10\n"), perm: 0o444, static: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := lookup(p, tc.path)
			if !ok {
				t.Fatalf("lookup(%q) found nothing", tc.path)
			}
			if got.kind != tc.want.kind || !bytes.Equal(got.data, tc.want.data) || got.perm != tc.want.perm ||
				got.uid != tc.want.uid || got.gid != tc.want.gid || got.static != tc.want.static {
				t.Errorf("lookup(%q) = %+v, want %+v", tc.path, got, tc.want)
			}
		})
	}

	t.Run("lease owned by its owner", func(t *testing.T) {
		got, ok := lookup(p, "leases/lease-1")
		if !ok || got.kind != kindFile || got.perm != 0o400 || got.uid != 1000 || got.gid != 1000 || got.static {
			t.Errorf("lookup(leases/lease-1) = %+v, %v; want a dynamic file 0400 owned by 1000:1000", got, ok)
		}
	})
}

func TestLookupMissing(t *testing.T) {
	p := publish(t, testSnapshot(7, 28), testLease("lease-1", 1000))
	tests := []struct{ name, path string }{
		{"unknown root name", "nope"},
		{"below a file", "free_units/x"},
		{"unknown gpu index", "gpus/2"},
		{"index not canonical", "gpus/00"},
		{"unknown uuid", "gpus/GPU-cccc"},
		{"through the uuid link", "gpus/GPU-aaaa/uuid"},
		{"unknown gpu file", "gpus/0/units_lent"},
		{"unknown reservation", "reservations/wf2"},
		{"below a reservation", "reservations/wf1/x"},
		{"below a gpu file", "gpus/0/uuid/x"},
		{"unknown lease", "leases/lease-2"},
		{"below a lease", "leases/lease-1/x"},
		{"dot", "gpus/."},
		{"dot dot", "leases/.."},
		{"empty component", "gpus//uuid"},
		{"trailing slash", "free_units/"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if e, ok := lookup(p, tc.path); ok {
				t.Errorf("lookup(%q) = %+v, want nothing", tc.path, e)
			}
			if b, ok := render(p, tc.path); ok {
				t.Errorf("render(%q) = %q, want nothing", tc.path, b)
			}
		})
	}
}

func names(ds []dirent) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.name
	}
	return out
}

func TestList(t *testing.T) {
	p := publish(t, testSnapshot(7, 28), testLease("lease-2", 1000), testLease("lease-1", 1001))
	gpuFiles := []string{"uuid", "name", "state", "eligible", "units_total", "units_used", "units_free",
		"units_offline", "units_reserved", "utilization_pct", "kernel_time_pct", "memory_used_mib", "memory_held_mib", "memory_total_mib", "outside_memory_mib"}
	tests := []struct {
		name string
		path string
		want []string // nil: not a directory
	}{
		{"root", "", []string{"free_units", "total_units", "reserved_units", "state", "snapshot.json", "metrics", "gpus", "leases", "reservations"}},
		{"reservations", "reservations", []string{"wf1"}},
		{"gpus", "gpus", []string{"0", "1", "GPU-aaaa", "GPU-bbbb"}},
		{"gpu 0", "gpus/0", gpuFiles},
		{"gpu 1", "gpus/1", gpuFiles},
		{"leases by id", "leases", []string{"lease-1", "lease-2"}},
		{"file", "free_units", nil},
		{"link", "gpus/GPU-aaaa", nil},
		{"missing", "gpus/7", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := list(p, tc.path)
			if tc.want == nil {
				if ok {
					t.Fatalf("list(%q) = %v, want not a directory", tc.path, names(got))
				}
				return
			}
			if !ok || !slices.Equal(names(got), tc.want) {
				t.Fatalf("list(%q) = %v, %v; want %v", tc.path, names(got), ok, tc.want)
			}
			// Every listed name resolves, with the kind the listing gave.
			for _, d := range got {
				e, ok := lookup(p, join(tc.path, d.name))
				if !ok || e.kind != d.kind {
					t.Errorf("listed %q: lookup = %+v, %v; want kind %d", join(tc.path, d.name), e, ok, d.kind)
				}
			}
		})
	}
}

func TestListOddSnapshots(t *testing.T) {
	s := testSnapshot(1, 0)
	s.GPUs = append(s.GPUs,
		api.GPU{Index: 0, UUID: "GPU-dup-index"}, // same index as the first: shadowed
		api.GPU{Index: 2, UUID: "1"},             // UUID that looks like an index: shadowed
		api.GPU{Index: 3, UUID: "a/b"},           // not a path component: left out
		api.GPU{Index: 4, UUID: ""},
	)
	p := publish(t, s, testLease("x", 1), testLease("x", 2), testLease("..", 3), testLease("a/b", 4))
	tests := []struct {
		name string
		path string
		want []string
	}{
		{"gpus", "gpus", []string{"0", "1", "2", "3", "4", "GPU-aaaa", "GPU-bbbb", "GPU-dup-index"}},
		{"leases", "leases", []string{"x"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := list(p, tc.path)
			if !slices.Equal(names(got), tc.want) {
				t.Errorf("list(%q) = %v, want %v", tc.path, names(got), tc.want)
			}
		})
	}
	t.Run("duplicates resolve to the first", func(t *testing.T) {
		if b, _ := render(p, "gpus/0/uuid"); string(b) != "GPU-aaaa\n" {
			t.Errorf("gpus/0/uuid = %q, want the first GPU 0", b)
		}
		if e, _ := lookup(p, "leases/x"); e.uid != 1 {
			t.Errorf("leases/x owned by %d, want the first lease's owner 1", e.uid)
		}
	})
}

func TestNilSnapshot(t *testing.T) {
	tests := []struct {
		name string
		p    *snapshot.Published
	}{
		{"nothing published", nil},
		{"published without a snapshot", &snapshot.Published{}},
	}
	for _, tc := range tests {
		p := tc.p
		t.Run(tc.name, func(t *testing.T) {
			root, _ := list(p, "")
			for _, d := range root {
				e, ok := lookup(p, d.name)
				if !ok || e.kind != d.kind || len(e.data) != 0 {
					t.Errorf("lookup(%q) = %+v, %v; want an empty %d", d.name, e, ok, d.kind)
				}
			}
			for _, dir := range []string{"gpus", "leases"} {
				if got, ok := list(p, dir); !ok || len(got) != 0 {
					t.Errorf("list(%q) = %v, %v; want empty", dir, names(got), ok)
				}
			}
			if _, ok := lookup(p, "gpus/0"); ok {
				t.Error("gpus/0 exists without a snapshot")
			}
		})
	}
}

func TestInodeNumbers(t *testing.T) {
	p := publish(t, testSnapshot(7, 28), testLease("lease-1", 1000))
	seen := map[uint64]string{}
	var walk func(dir string)
	walk = func(dir string) {
		ds, _ := list(p, dir)
		for _, d := range ds {
			path := join(dir, d.name)
			ino := inode(d.kind, path)
			if ino < 2 || ino >= 1<<63 {
				t.Errorf("inode(%q) = %d, outside [2, 2^63)", path, ino)
			}
			if other, dup := seen[ino]; dup {
				t.Errorf("inode(%q) = inode(%q) = %d", path, other, ino)
			}
			seen[ino] = path
			if d.kind == kindDir {
				walk(path)
			}
		}
	}
	walk("")
	// The root's 9, gpus/ (2 GPUs and 2 links), 2 GPUs of 15 files, one
	// lease, one reservation.
	if want := 9 + 4 + 2*15 + 1 + 1; len(seen) != want {
		t.Errorf("walked %d names, want %d", len(seen), want)
	}
}

func TestHandleRead(t *testing.T) {
	h := &handle{data: []byte("0123456789")}
	tests := []struct {
		name string
		off  int64
		size int
		want string
	}{
		{"whole", 0, 4096, "0123456789"},
		{"prefix", 0, 4, "0123"},
		{"middle", 3, 4, "3456"},
		{"tail", 8, 4096, "89"},
		{"at end", 10, 4096, ""},
		{"past end", 1 << 40, 4096, ""},
		{"negative", -1, 4096, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, errno := h.Read(context.Background(), make([]byte, tc.size), tc.off)
			if errno != 0 {
				t.Fatal(errno)
			}
			got, _ := res.Bytes(make([]byte, tc.size))
			if string(got) != tc.want {
				t.Errorf("Read(off %d, %d bytes) = %q, want %q", tc.off, tc.size, got, tc.want)
			}
		})
	}
}

func TestOpenRefusesWrites(t *testing.T) {
	var store snapshot.Store
	store.Store(publish(t, testSnapshot(7, 28)))
	n := &node{t: &tree{src: &store}, path: "free_units", kind: kindFile}
	tests := []struct {
		name  string
		flags uint32
		want  syscall.Errno
	}{
		{"read", syscall.O_RDONLY, 0},
		{"write", syscall.O_WRONLY, syscall.EROFS},
		{"read write", syscall.O_RDWR, syscall.EROFS},
		{"truncate", syscall.O_RDONLY | syscall.O_TRUNC, syscall.EROFS},
		{"append", syscall.O_WRONLY | syscall.O_APPEND, syscall.EROFS},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, errno := n.Open(context.Background(), tc.flags)
			if errno != tc.want {
				t.Errorf("Open(%#x) = %v, want %v", tc.flags, errno, tc.want)
			}
		})
	}
}

// FuzzLookup checks that no path panics the layout and that lookup, list and
// render agree.
func FuzzLookup(f *testing.F) {
	p := publish(f, testSnapshot(7, 28), testLease("lease-1", 1000))
	for _, tc := range layoutCases(p, 1000) {
		f.Add(tc.path)
	}
	for _, s := range []string{"", "gpus", "leases", "gpus/GPU-aaaa", "gpus/0/", "/", "gpus/-1", "leases/\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		e, ok := lookup(p, path)
		b, rok := render(p, path)
		if rok != (ok && e.kind == kindFile) || !bytes.Equal(b, e.data) && rok {
			t.Fatalf("render(%q) = %q, %v disagrees with lookup = %+v, %v", path, b, rok, e, ok)
		}
		_, lok := list(p, path)
		if lok != (ok && e.kind == kindDir) {
			t.Fatalf("list(%q) ok = %v, lookup = %+v, %v", path, lok, e, ok)
		}
		if !ok || path == "" {
			return
		}
		dir, name := "", path
		if i := bytes.LastIndexByte([]byte(path), '/'); i >= 0 {
			dir, name = path[:i], path[i+1:]
		}
		ds, _ := list(p, dir)
		if !slices.ContainsFunc(ds, func(d dirent) bool { return d.name == name && d.kind == e.kind }) {
			t.Fatalf("%q resolves but %q does not list it", path, dir)
		}
	})
}
