package fsview

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/snapshot"
)

// childEnv makes the test binary a process that mounts a view at the named
// directory and serves it until killed (see TestMountReplacesStaleMount).
const childEnv = "FSVIEW_TEST_SERVE_AT"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		serveChild(dir)
		return
	}
	os.Exit(m.Run())
}

func serveChild(dir string) {
	var store snapshot.Store
	p := snapshot.New(testSnapshot(1, 5), nil, testMetrics)
	store.Store(p)
	if _, err := Mount(dir, &store, Options{Logger: quietLogger()}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("mounted")
	time.Sleep(time.Hour)
	os.Exit(1)
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// requireFUSE skips tests that need a real mount where none can be made.
func requireFUSE(tb testing.TB) {
	tb.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		tb.Skipf("no real mount: /dev/fuse: %v", err)
	}
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			tb.Skip("no real mount: not root and no fusermount3")
		}
		// fusermount3 opens /dev/fuse as the calling user.
		if err := syscall.Access("/dev/fuse", 4|2); err != nil { // R_OK|W_OK
			tb.Skipf("no real mount: not root and /dev/fuse: %v", err)
		}
	}
}

// leaseOwner owns the leases that tests read through a mount: any user as root,
// else the user itself, since the kernel keeps a lease file to its owner.
func leaseOwner() uint32 {
	if uid := os.Geteuid(); uid != 0 {
		return uint32(uid)
	}
	return 1000
}

// mountAt mounts a view of src at dir and unmounts it when the test ends.
func mountAt(tb testing.TB, dir string, src Source) *View {
	tb.Helper()
	v, err := Mount(dir, src, Options{Logger: quietLogger()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := v.Close(); err != nil {
			tb.Error(err)
		}
	})
	return v
}

// mountView mounts a view of src in a fresh directory.
func mountView(tb testing.TB, src Source) (*View, string) {
	tb.Helper()
	requireFUSE(tb)
	dir := filepath.Join(tb.TempDir(), "view")
	return mountAt(tb, dir, src), dir
}

// mountedAt reports whether /proc/self/mountinfo lists dir as a mount point.
func mountedAt(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestMountLayout(t *testing.T) {
	var store snapshot.Store
	owner := leaseOwner()
	p := publish(t, testSnapshot(7, 28), testLease("lease-1", owner))
	store.Store(p)
	_, dir := mountView(t, &store)

	for _, tc := range layoutCases(p, owner) {
		t.Run(tc.path, func(t *testing.T) {
			path := filepath.Join(dir, tc.path)
			if got := readFile(t, path); got != tc.want {
				t.Errorf("%s = %q, want %q", tc.path, got, tc.want)
			}
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if st.Size() != int64(len(tc.want)) {
				t.Errorf("%s: size %d, want %d", tc.path, st.Size(), len(tc.want))
			}
		})
	}

	t.Run("listings", func(t *testing.T) {
		tests := []struct {
			dir  string
			want []string // sorted, as os.ReadDir returns them
		}{
			{"", []string{"free_units", "gpus", "leases", "metrics", "reservations", "reserved_units", "snapshot.json", "state", "total_units"}},
			{"gpus", []string{"0", "1", "GPU-aaaa", "GPU-bbbb"}},
			{"gpus/1", []string{"eligible", "kernel_time_pct", "memory_held_mib", "memory_total_mib", "memory_used_mib", "name", "outside_memory_mib", "state", "units_free",
				"units_offline", "units_reserved", "units_total", "units_used", "utilization_pct", "uuid"}},
			{"leases", []string{"lease-1"}},
			{"reservations", []string{"wf1"}},
		}
		for _, tc := range tests {
			if got := dirNames(t, filepath.Join(dir, tc.dir)); !slices.Equal(got, tc.want) {
				t.Errorf("ls %q = %v, want %v", tc.dir, got, tc.want)
			}
		}
	})

	t.Run("attributes", func(t *testing.T) {
		tests := []struct {
			path string
			mode fs.FileMode
			uid  uint32
		}{
			{"", fs.ModeDir | 0o555, 0},
			{"gpus/0", fs.ModeDir | 0o555, 0},
			{"free_units", 0o444, 0},
			{"gpus/0/units_free", 0o444, 0},
			{"gpus/GPU-aaaa", fs.ModeSymlink | 0o777, 0},
			{"leases/lease-1", 0o400, owner},
		}
		for _, tc := range tests {
			st, err := os.Lstat(filepath.Join(dir, tc.path))
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode() != tc.mode || st.Sys().(*syscall.Stat_t).Uid != tc.uid {
				t.Errorf("%q: mode %v uid %d, want %v uid %d", tc.path, st.Mode(), st.Sys().(*syscall.Stat_t).Uid, tc.mode, tc.uid)
			}
		}
		st, _ := os.Stat(filepath.Join(dir, "free_units"))
		if !st.ModTime().Equal(p.Snapshot.Time) {
			t.Errorf("free_units mtime %v, want the snapshot's time %v", st.ModTime(), p.Snapshot.Time)
		}
	})

	t.Run("reads at offsets", func(t *testing.T) {
		f, err := os.Open(filepath.Join(dir, "snapshot.json"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		tests := []struct {
			name string
			off  int64
			want string
		}{
			{"start", 0, string(p.JSON()[:10])},
			{"middle", 5, string(p.JSON()[5:15])},
			{"tail", int64(len(p.JSON()) - 3), string(p.JSON()[len(p.JSON())-3:])},
			{"past end", int64(len(p.JSON()) + 100), ""},
		}
		for _, tc := range tests {
			buf := make([]byte, 10)
			n, err := f.ReadAt(buf, tc.off)
			if err != nil && err != io.EOF {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if string(buf[:n]) != tc.want {
				t.Errorf("%s: read %q at %d, want %q", tc.name, buf[:n], tc.off, tc.want)
			}
		}
	})
}

func TestMountSymlink(t *testing.T) {
	var store snapshot.Store
	store.Store(publish(t, testSnapshot(7, 28)))
	_, dir := mountView(t, &store)

	tests := []struct {
		uuid  string
		index string
	}{
		{"GPU-aaaa", "0"},
		{"GPU-bbbb", "1"},
	}
	for _, tc := range tests {
		t.Run(tc.uuid, func(t *testing.T) {
			link := filepath.Join(dir, "gpus", tc.uuid)
			target, err := os.Readlink(link)
			if err != nil || target != tc.index {
				t.Fatalf("readlink %s = %q, %v; want %q", tc.uuid, target, err, tc.index)
			}
			resolved, err := filepath.EvalSymlinks(link)
			if err != nil || resolved != filepath.Join(dir, "gpus", tc.index) {
				t.Errorf("%s resolves to %q, %v; want gpus/%s", tc.uuid, resolved, err, tc.index)
			}
			if st, err := os.Stat(link); err != nil || !st.IsDir() {
				t.Errorf("stat through %s: %v, %v; want a directory", tc.uuid, st, err)
			}
			if got := readFile(t, filepath.Join(link, "uuid")); got != tc.uuid+"\n" {
				t.Errorf("%s/uuid = %q", tc.uuid, got)
			}
		})
	}
}

// TestMountFollowsStore checks that every read shows the snapshot stored last:
// names come and go and values change with no kernel cache in the way.
func TestMountFollowsStore(t *testing.T) {
	var store snapshot.Store
	_, dir := mountView(t, &store)
	oneGPU := testSnapshot(4, 30)
	oneGPU.GPUs = oneGPU.GPUs[:1]

	steps := []struct {
		name       string
		p          *snapshot.Published
		freeUnits  string
		leases     []string
		gpus       []string
		goneLeases []string
		goneGPUs   []string
	}{
		{"no lease", publish(t, testSnapshot(1, 28)), "28\n", nil, []string{"0", "1", "GPU-aaaa", "GPU-bbbb"}, []string{"lease-1"}, nil},
		{"lease appears", publish(t, testSnapshot(2, 26), testLease("lease-1", leaseOwner())), "26\n", []string{"lease-1"}, []string{"0", "1", "GPU-aaaa", "GPU-bbbb"}, nil, nil},
		{"lease released", publish(t, testSnapshot(3, 28)), "28\n", nil, []string{"0", "1", "GPU-aaaa", "GPU-bbbb"}, []string{"lease-1"}, nil},
		{"gpu lost", publish(t, oneGPU), "30\n", nil, []string{"0", "GPU-aaaa"}, nil, []string{"1", "GPU-bbbb"}},
		{"gpu back", publish(t, testSnapshot(5, 12), testLease("lease-2", leaseOwner())), "12\n", []string{"lease-2"}, []string{"0", "1", "GPU-aaaa", "GPU-bbbb"}, nil, nil},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			store.Store(step.p)
			if got := readFile(t, filepath.Join(dir, "free_units")); got != step.freeUnits {
				t.Errorf("free_units = %q, want %q", got, step.freeUnits)
			}
			if got := readFile(t, filepath.Join(dir, "snapshot.json")); got != string(step.p.JSON()) {
				t.Errorf("snapshot.json is not the stored one:\n%s", got)
			}
			if got := dirNames(t, filepath.Join(dir, "leases")); !slices.Equal(got, step.leases) {
				t.Errorf("leases = %v, want %v", got, step.leases)
			}
			if got := dirNames(t, filepath.Join(dir, "gpus")); !slices.Equal(got, step.gpus) {
				t.Errorf("gpus = %v, want %v", got, step.gpus)
			}
			for _, id := range step.leases {
				var l api.Lease
				if err := json.Unmarshal([]byte(readFile(t, filepath.Join(dir, "leases", id))), &l); err != nil || l.ID != id {
					t.Errorf("leases/%s: %+v, %v", id, l, err)
				}
			}
			for _, gone := range append(prefixed("leases/", step.goneLeases), prefixed("gpus/", step.goneGPUs)...) {
				if _, err := os.Lstat(filepath.Join(dir, gone)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("stat %s: %v, want not found", gone, err)
				}
				if _, err := os.ReadFile(filepath.Join(dir, gone)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("read %s: %v, want not found", gone, err)
				}
			}
		})
	}

	t.Run("open file keeps its snapshot", func(t *testing.T) {
		store.Store(publish(t, testSnapshot(6, 20)))
		f, err := os.Open(filepath.Join(dir, "free_units"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		store.Store(publish(t, testSnapshot(7, 21)))
		if b, _ := io.ReadAll(f); string(b) != "20\n" {
			t.Errorf("read %q after a new snapshot, want what was current at open, 20", b)
		}
		if got := readFile(t, filepath.Join(dir, "free_units")); got != "21\n" {
			t.Errorf("a new open reads %q, want 21", got)
		}
	})
}

func prefixed(prefix string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = prefix + n
	}
	return out
}

func TestMountNilSnapshot(t *testing.T) {
	var store snapshot.Store
	_, dir := mountView(t, &store)

	if got := dirNames(t, dir); len(got) != len(rootNames) {
		t.Errorf("root = %v, want the %d fixed names", got, len(rootNames))
	}
	if got := dirNames(t, filepath.Join(dir, "gpus")); len(got) != 0 {
		t.Errorf("gpus = %v, want empty", got)
	}
	if _, err := os.ReadFile(filepath.Join(dir, "free_units")); !errors.Is(err, syscall.EAGAIN) {
		t.Errorf("read free_units before any snapshot: %v, want EAGAIN", err)
	}
	store.Store(publish(t, testSnapshot(1, 3)))
	if got := readFile(t, filepath.Join(dir, "free_units")); got != "3\n" {
		t.Errorf("free_units = %q after the first snapshot, want 3", got)
	}
}

func TestMountReadOnly(t *testing.T) {
	var store snapshot.Store
	store.Store(publish(t, testSnapshot(7, 28), testLease("lease-1", 1000)))
	_, dir := mountView(t, &store)
	at := func(p string) string { return filepath.Join(dir, p) }

	tests := []struct {
		name string
		op   func() error
	}{
		{"write a file", func() error { return os.WriteFile(at("free_units"), []byte("1\n"), 0o644) }},
		{"open read-write", func() error {
			f, err := os.OpenFile(at("gpus/0/units_free"), os.O_RDWR, 0)
			if err == nil {
				f.Close()
			}
			return err
		}},
		{"append", func() error {
			f, err := os.OpenFile(at("state"), os.O_WRONLY|os.O_APPEND, 0)
			if err == nil {
				f.Close()
			}
			return err
		}},
		{"truncate", func() error { return os.Truncate(at("snapshot.json"), 0) }},
		{"create", func() error { return os.WriteFile(at("new"), nil, 0o644) }},
		{"create in leases", func() error { return os.WriteFile(at("leases/new"), nil, 0o644) }},
		{"mkdir", func() error { return os.Mkdir(at("gpus/9"), 0o755) }},
		{"chmod", func() error { return os.Chmod(at("free_units"), 0o666) }},
		{"chown", func() error { return os.Chown(at("leases/lease-1"), 0, 0) }},
		{"set times", func() error { return os.Chtimes(at("metrics"), time.Now(), time.Now()) }},
		{"rename", func() error { return os.Rename(at("free_units"), at("free")) }},
		{"remove file", func() error { return os.Remove(at("leases/lease-1")) }},
		{"remove dir", func() error { return os.Remove(at("gpus/1")) }},
		{"remove link", func() error { return os.Remove(at("gpus/GPU-aaaa")) }},
		{"symlink", func() error { return os.Symlink("0", at("gpus/x")) }},
		{"hard link", func() error { return os.Link(at("free_units"), at("free")) }},
		{"mkfifo", func() error { return syscall.Mkfifo(at("fifo"), 0o644) }},
		{"set xattr", func() error { return syscall.Setxattr(at("state"), "user.x", []byte("1"), 0) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.op(); !errors.Is(err, syscall.EROFS) && !errors.Is(err, syscall.EACCES) {
				t.Errorf("got %v, want EROFS or EACCES", err)
			}
		})
	}
	if got := dirNames(t, dir); len(got) != len(rootNames) {
		t.Errorf("root = %v after the attempts, want the %d fixed names", got, len(rootNames))
	}
	if got := readFile(t, at("free_units")); got != "28\n" {
		t.Errorf("free_units = %q after the attempts", got)
	}
}

// TestMountLeaseOwnerOnly checks that the kernel enforces the modes the view
// reports, for users other than the mounting one.
func TestMountLeaseOwnerOnly(t *testing.T) {
	requireFUSE(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to read as other users")
	}
	// Other users must be able to reach the mount point.
	base, err := os.MkdirTemp("", "fsview-owner-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	var store snapshot.Store
	store.Store(publish(t, testSnapshot(7, 28), testLease("mine", 1000), testLease("theirs", 1001)))
	dir := filepath.Join(base, "view")
	mountAt(t, dir, &store)

	tests := []struct {
		name string
		uid  uint32
		path string
		ok   bool
	}{
		{"owner reads own lease", 1000, "leases/mine", true},
		{"other user cannot", 1000, "leases/theirs", false},
		{"other owner reads own", 1001, "leases/theirs", true},
		{"anyone reads free_units", 1002, "free_units", true},
		{"anyone reads gpu files", 1002, "gpus/GPU-bbbb/name", true},
		{"anyone lists leases", 1002, "leases", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("cat", filepath.Join(dir, tc.path))
			if tc.path == "leases" {
				cmd = exec.Command("ls", filepath.Join(dir, tc.path))
			}
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: tc.uid, Gid: tc.uid}}
			out, err := cmd.CombinedOutput()
			if (err == nil) != tc.ok {
				t.Errorf("uid %d reading %s: %v %s; want success %v", tc.uid, tc.path, err, out, tc.ok)
			}
			if !tc.ok && !strings.Contains(string(out), "Permission denied") {
				t.Errorf("uid %d reading %s: %s; want Permission denied", tc.uid, tc.path, out)
			}
		})
	}
}
