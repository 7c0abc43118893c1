package offline

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/pipefile"
)

// mpsLayout is testLayout with MPS on: every instance has a pipe folder.
func mpsLayout(t *testing.T) string {
	t.Helper()
	dir := testLayout(t)
	lay, err := pipefile.ReadLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range lay.GPUs {
		for _, in := range g.Instances {
			in.Env[pipefile.EnvPipeDirectory] = "/run/gpulet/mps/" + g.UUID
		}
	}
	b, _ := json.Marshal(lay)
	if err := os.WriteFile(filepath.Join(dir, "units", pipefile.LayoutFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func writeUsers(t *testing.T, dir string, pid int, gpus map[string][][]uint32) {
	t.Helper()
	b, err := pipefile.EncodeUsers(pipefile.Users{PID: pid, GPUs: gpus})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "units", pipefile.UsersFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// goneProcess is the pid of a process that has exited.
func goneProcess(t *testing.T) int {
	t.Helper()
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	return c.Process.Pid
}

// TestTakeKeepsOffOtherUsersInstances: with MPS, a claim passes by an
// instance that serves another user (a process there would wait until theirs
// end) and says so when no other instance has room.
func TestTakeKeepsOffOtherUsersInstances(t *testing.T) {
	me := os.Getpid()
	aBusy := map[string][][]uint32{"GPU-a": {{1001}, nil}}
	allBusy := map[string][][]uint32{"GPU-a": {{1001}, {1001, 1003}}, "GPU-b": {{1001}}}
	for _, tc := range []struct {
		name     string
		mps      bool
		pid      int
		users    map[string][][]uint32
		req      Request
		gpu      int
		instance int
		err      string
	}{
		{name: "passes by another user's instance", mps: true, pid: me, users: aBusy, req: Request{Units: 1, UID: 1002}, gpu: 0, instance: 1},
		{name: "joins its own user's instance", mps: true, pid: me, users: aBusy, req: Request{Units: 1, UID: 1001}, gpu: 0, instance: 0},
		{name: "next GPU", mps: true, pid: me, users: map[string][][]uint32{"GPU-a": {{1001}, {1001}}}, req: Request{Units: 1, UID: 1002}, gpu: 1, instance: 0},
		{name: "none serves only me", mps: true, pid: me, users: allBusy, req: Request{Units: 1, UID: 1002},
			err: "no instance that serves only uid 1002 has 1 unit(s) free; GPU 0 instance 0 has 2 free but serves uid 1001; GPU 0 instance 1 has 2 free but serves uid 1001, 1003; GPU 1 instance 0 has 2 free but serves uid 1001"},
		{name: "a file whose writer is gone: no claim under MPS", mps: true, pid: goneProcess(t), users: allBusy, req: Request{Units: 1, UID: 1002},
			err: "gpuletd is not running (no users.json written by a live gpuletd)"},
		{name: "no file: no claim under MPS", mps: true, req: Request{Units: 1, UID: 1002}, err: "gpuletd is not running"},
		{name: "no file without MPS: anyone shares", mps: false, req: Request{Units: 1, UID: 1002}, gpu: 0, instance: 0},
		{name: "without MPS anyone shares", mps: false, pid: me, users: allBusy, req: Request{Units: 1, UID: 1002}, gpu: 0, instance: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testLayout(t)
			if tc.mps {
				dir = mpsLayout(t)
			}
			if tc.pid != 0 {
				writeUsers(t, dir, tc.pid, tc.users)
			}
			c, err := take(t, dir, tc.req)
			if tc.err != "" {
				if !(errors.Is(err, ErrNoUnits) || errors.Is(err, ErrNoDaemon)) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want ErrNoUnits or ErrNoDaemon and %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.GPU.Index != tc.gpu || c.Instance != tc.instance {
				t.Fatalf("claimed GPU %d instance %d, want GPU %d instance %d", c.GPU.Index, c.Instance, tc.gpu, tc.instance)
			}
		})
	}
}

// TestTakeKeepsOffAnotherUsersClaim: a claim of another user too new for
// users.json keeps the instance theirs; gpuletd's own FIFOs (leases) name
// no user.
func TestTakeKeepsOffAnotherUsersClaim(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a claim FIFO of another uid; runs as uid", os.Geteuid())
	}
	dir := mpsLayout(t)
	writeUsers(t, dir, os.Getpid(), nil)
	theirs := filepath.Join(dir, "units", "GPU-a", "0", pipefile.UnitName(0))
	if err := unix.Mkfifo(theirs, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(theirs, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(dir, "units", "GPU-a", "1", pipefile.UnitName(2)), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := take(t, dir, Request{Units: 1, UID: 1002})
	if err != nil || c.Instance != 1 || c.Units[0] != 3 {
		t.Fatalf("claim %+v, %v: want GPU 0 instance 1 unit 3, beside the lease, away from uid 4242's claim", c, err)
	}
	c, err = take(t, dir, Request{Units: 1, UID: 4242})
	if err != nil || c.Instance != 0 || c.Units[0] != 1 {
		t.Fatalf("claim %+v, %v: want GPU 0 instance 0 unit 1, beside uid 4242's own claim", c, err)
	}
}

// TestTakeJoinsSurplusClaims: another user's claim on an instance where
// users.json says their holds are surplus (they bind more instances than
// their units fill) keeps nobody off; elsewhere it still does.
func TestTakeJoinsSurplusClaims(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a claim FIFO of another uid; runs as uid", os.Geteuid())
	}
	dir := mpsLayout(t)
	for k := range 2 {
		theirs := filepath.Join(dir, "units", "GPU-a", strconv.Itoa(k), pipefile.UnitName(2*k))
		if err := unix.Mkfifo(theirs, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(theirs, 4242, 4242); err != nil {
			t.Fatal(err)
		}
	}
	users := pipefile.Users{PID: os.Getpid(), GPUs: map[string][][]uint32{"GPU-a": {{4242}, nil}, "GPU-b": {nil}}}
	write := func() {
		b, err := pipefile.EncodeUsers(users)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "units", pipefile.UsersFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write()
	if c, err := take(t, dir, Request{Units: 1, UID: 1002, GPU: "0"}); err == nil {
		t.Fatalf("claim %+v beside uid 4242's claims, which users.json does not call surplus", c)
	}
	users.Surplus = map[string][][]uint32{"GPU-a": {nil, {4242}}}
	write()
	c, err := take(t, dir, Request{Units: 1, UID: 1002, GPU: "0"})
	if err != nil || c.Instance != 1 {
		t.Fatalf("claim %+v, %v: want GPU 0 instance 1, where uid 4242's claim is surplus", c, err)
	}
}
