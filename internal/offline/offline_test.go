package offline

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/pipefile"
)

// testLayout writes a layout with two instances on GPU 0 and one on GPU 1.
func testLayout(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	lay := &pipefile.Layout{Schema: pipefile.LayoutSchema, GPUs: []pipefile.LayoutGPU{
		{Index: 0, UUID: "GPU-a", Name: "NVIDIA A100-SXM4-80GB", UnitsTotal: 4, Instances: []pipefile.LayoutInstance{
			{Instance: 0, Units: []int{0, 1}, Env: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-a", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M"}},
			{Instance: 1, Units: []int{2, 3}, Env: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-a"}},
		}},
		{Index: 1, UUID: "GPU-b", Name: "Tesla T4", UnitsTotal: 2, Instances: []pipefile.LayoutInstance{
			{Instance: 0, Units: []int{0, 1}, Env: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-b"}},
		}},
	}}
	for _, g := range lay.GPUs {
		for _, in := range g.Instances {
			if err := os.MkdirAll(filepath.Join(dir, "units", g.UUID, strconv.Itoa(in.Instance)), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	b, _ := json.Marshal(lay)
	if err := os.WriteFile(filepath.Join(dir, "units", pipefile.LayoutFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func take(t *testing.T, dir string, req Request) (*Claim, error) {
	t.Helper()
	lay, err := pipefile.ReadLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Take(dir, lay, req)
	if err == nil {
		t.Cleanup(c.Release)
	}
	return c, err
}

func TestTakeClaimsLockedFIFOs(t *testing.T) {
	dir := testLayout(t)
	c, err := take(t, dir, Request{Units: 2})
	if err != nil {
		t.Fatal(err)
	}
	if c.GPU.UUID != "GPU-a" || c.Instance != 0 || len(c.FDs) != 2 {
		t.Fatalf("claim %+v", c)
	}
	if c.Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "50" || c.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=40960M" || c.Env["CUDA_VISIBLE_DEVICES"] != "GPU-a" {
		t.Fatalf("env %v", c.Env)
	}
	for i, u := range c.Units {
		p := filepath.Join(dir, "units", "GPU-a", "0", pipefile.UnitName(u))
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			t.Fatalf("%s is not a FIFO: %v", p, err)
		}
		// Another open of the FIFO cannot take the lock: the claim is held.
		fd, err := unix.Open(p, unix.O_RDWR|unix.O_NONBLOCK, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
			t.Fatalf("claim on unit %d not locked: %v", u, err)
		}
		unix.Close(fd)
		// The descriptor survives exec.
		flags, err := unix.FcntlInt(uintptr(c.FDs[i]), unix.F_GETFD, 0)
		if err != nil || flags&unix.FD_CLOEXEC != 0 {
			t.Fatalf("claim descriptor of unit %d is close-on-exec (flags %#x, %v)", u, flags, err)
		}
	}
	// No temporary names are left behind.
	ents, _ := os.ReadDir(filepath.Join(dir, "units", "GPU-a", "0"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Fatalf("temporary claim name left: %s", e.Name())
		}
	}
}

func TestTakePlacement(t *testing.T) {
	for _, tc := range []struct {
		name     string
		taken    []string // unit FIFOs made beforehand, GPU-uuid/instance/unit-i
		req      Request
		gpu      int
		instance int
		units    string
		err      string
	}{
		{name: "first instance", req: Request{Units: 1}, gpu: 0, instance: 0, units: "0"},
		{name: "skips taken names", taken: []string{"GPU-a/0/unit-0"}, req: Request{Units: 1}, gpu: 0, instance: 0, units: "1"},
		{name: "next instance when one is short", taken: []string{"GPU-a/0/unit-1"}, req: Request{Units: 2}, gpu: 0, instance: 1, units: "2,3"},
		{name: "next GPU", taken: []string{"GPU-a/0/unit-0", "GPU-a/1/unit-3"}, req: Request{Units: 2}, gpu: 1, instance: 0, units: "0,1"},
		{name: "by index", req: Request{Units: 1, GPU: "1"}, gpu: 1, instance: 0, units: "0"},
		{name: "by uuid", req: Request{Units: 1, GPU: "gpu-b"}, gpu: 1, instance: 0, units: "0"},
		{name: "by type", req: Request{Units: 2, Type: "t4"}, gpu: 1, instance: 0, units: "0,1"},
		{name: "units never span instances", req: Request{Units: 3}, err: "no free units: 3 unit(s) can never be claimed at once: a claim lies on one MPS instance, and none here has more than 2 unit(s)"},
		{name: "no instance has them free", taken: []string{"GPU-a/0/unit-0", "GPU-a/1/unit-2", "GPU-b/0/unit-0"}, req: Request{Units: 2},
			err: "no free units: no instance has 2 unit(s) free; free now: GPU 0 (NVIDIA A100-SXM4-80GB) 2 of 4, GPU 1 (Tesla T4) 1 of 2"},
		{name: "full GPU", taken: []string{"GPU-b/0/unit-1"}, req: Request{Units: 2, GPU: "1"}, err: "free now: GPU 1 (Tesla T4) 1 of 2"},
		{name: "no such index", req: Request{Units: 1, GPU: "7"}, err: `no GPU in the layout matches --gpu "7"`},
		{name: "no such type", req: Request{Units: 1, Type: "H100"}, err: `matches --type "H100" (this node has 0 GPU-a NVIDIA A100-SXM4-80GB, 1 GPU-b Tesla T4)`},
		{name: "zero units", req: Request{Units: 0}, err: "--units must be at least 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testLayout(t)
			for _, p := range tc.taken {
				if err := unix.Mkfifo(filepath.Join(dir, "units", p), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			c, err := take(t, dir, tc.req)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := make([]string, len(c.Units))
			for i, u := range c.Units {
				got[i] = strconv.Itoa(u)
			}
			if c.GPU.Index != tc.gpu || c.Instance != tc.instance || strings.Join(got, ",") != tc.units {
				t.Fatalf("claimed GPU %d instance %d units %v, want GPU %d instance %d units %s", c.GPU.Index, c.Instance, got, tc.gpu, tc.instance, tc.units)
			}
		})
	}
}

func TestNoFreeUnitsIsErrNoUnits(t *testing.T) {
	dir := testLayout(t)
	if _, err := take(t, dir, Request{Units: 2, GPU: "1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := take(t, dir, Request{Units: 1, GPU: "1"}); !errors.Is(err, ErrNoUnits) {
		t.Fatalf("claim on a full GPU: %v", err)
	}
}

func TestReleaseGivesUnitsBack(t *testing.T) {
	dir := testLayout(t)
	lay, _ := pipefile.ReadLayout(dir)
	c, err := Take(dir, lay, Request{Units: 2, GPU: "1"})
	if err != nil {
		t.Fatal(err)
	}
	fds := c.FDs
	c.Release()
	ents, _ := os.ReadDir(filepath.Join(dir, "units", "GPU-b", "0"))
	if len(ents) != 0 {
		t.Fatalf("left after release: %v", ents)
	}
	for _, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
			t.Fatalf("descriptor %d still open after release", fd)
		}
	}
	if _, err := take(t, dir, Request{Units: 2, GPU: "1"}); err != nil {
		t.Fatalf("claim after release: %v", err)
	}
}

// TestClaimIsLiveToTheLedger checks the claim against the daemon's own probe:
// a held claim is live, and one whose holder closed its descriptors is stale.
func TestClaimIsLiveToTheLedger(t *testing.T) {
	run := t.TempDir()
	model := units.Default()
	l, err := ledger.New(run, model, []ledger.GPU{{Index: 0, UUID: "GPU-x", Name: "Tesla T4"}}, -1, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.WriteLayout(func(g, k int) map[string]string {
		return map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-x", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "7"}
	}); err != nil {
		t.Fatal(err)
	}
	lay, err := pipefile.ReadLayout(run)
	if err != nil {
		t.Fatalf("the daemon's own layout.json: %v", err)
	}
	c, err := Take(run, lay, Request{Units: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]; got != "19" {
		t.Fatalf("3 of 16 units: thread percentage %s, want 19", got)
	}
	present, err := l.Scan(0)
	if err != nil || len(present) != 3 {
		t.Fatalf("ledger sees %v, %v", present, err)
	}
	_, id, _ := l.Stat(0, c.Units[0])
	if stale, err := l.Probe(0, c.Units[0], id); stale || err != nil {
		t.Fatalf("held claim probed stale=%v err=%v", stale, err)
	}
	// The holder dies without cleaning up: its names stay, unlocked.
	for _, fd := range c.FDs {
		unix.Close(fd)
	}
	if stale, err := l.Probe(0, c.Units[0], id); !stale || err != nil {
		t.Fatalf("abandoned claim probed stale=%v err=%v", stale, err)
	}
}

// A local user's FUSE mount at a unit name (on a folder of their own), which
// nobody else may look at, is no free unit; it must not stop every claim that
// looks at its folder.
func TestTakePassesByAMountAtAUnitName(t *testing.T) {
	dir := testLayout(t)
	at := filepath.Join(dir, "units", "GPU-a", "0", pipefile.UnitName(0))
	if err := os.Mkdir(at, 0o755); err != nil {
		t.Fatal(err)
	}
	testutil.MountOthersFUSE(t, at)
	c, err := take(t, dir, Request{Units: 1})
	if err != nil {
		t.Fatal(err)
	}
	if c.GPU.Index != 0 || c.Instance != 0 || len(c.Units) != 1 || c.Units[0] != 1 {
		t.Fatalf("claimed GPU %d instance %d units %v, want unit 1 beside the mount", c.GPU.Index, c.Instance, c.Units)
	}
	// Two units: instance 0 has one free now, instance 1 two.
	if c, err = take(t, dir, Request{Units: 2, GPU: "0"}); err != nil || c.Instance != 1 {
		t.Fatalf("claim of 2 units: %+v, %v", c, err)
	}
}

// A GPU whose folders are closed to the claimer (a pool of other users: the
// ledger lets only them in) is passed by, as a full one is: a claim that names
// no GPU goes to one the claimer may use, and one that names the closed GPU
// says why it failed. A FUSE mount of another user stands in for the closed
// folders: root too gets EACCES there.
func TestTakePassesByAGPUClosedToTheClaimer(t *testing.T) {
	dir := testLayout(t)
	for _, k := range []string{"0", "1"} {
		testutil.MountOthersFUSE(t, filepath.Join(dir, "units", "GPU-a", k))
	}
	c, err := take(t, dir, Request{Units: 2})
	if err != nil {
		t.Fatalf("claim beside a closed GPU: %v", err)
	}
	if c.GPU.Index != 1 {
		t.Fatalf("claimed on GPU %d, want GPU 1", c.GPU.Index)
	}
	// GPU 1 is full now: the refusal says what was free and what was closed.
	if _, err := take(t, dir, Request{Units: 1}); !errors.Is(err, ErrNoUnits) || !strings.Contains(err.Error(), "GPU 0 (NVIDIA A100-SXM4-80GB) closed to you") {
		t.Fatalf("claim on a full node beside a closed GPU: %v", err)
	}
	_, err = take(t, dir, Request{Units: 1, GPU: "0"})
	if err == nil || !errors.Is(err, unix.EACCES) || !strings.Contains(err.Error(), "offline claims are open to the members of gpuletd's --socket-group") {
		t.Fatalf("claim on the closed GPU: %v", err)
	}
}
