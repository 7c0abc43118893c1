package test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

func isMounted(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

func readView(t *testing.T, view, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(view, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestViewEndToEnd(t *testing.T) {
	e2e.RequireFUSE(t)
	view := filepath.Join(t.TempDir(), "view")
	d := e2e.Start(t, "--mount", view)
	if !isMounted(t, view) {
		t.Fatal("view not mounted when gpuletd answers")
	}
	s, err := d.Client.Snapshot(e2e.Ctx(t))
	if err != nil || s.View == nil || !s.View.Mounted {
		t.Fatalf("snapshot view status %+v %v", s.View, err)
	}

	var vs api.Snapshot
	if err := json.Unmarshal([]byte(readView(t, view, "snapshot.json")), &vs); err != nil {
		t.Fatal(err)
	}
	if readView(t, view, "free_units") != strconv.Itoa(vs.UnitsFree)+"\n" ||
		readView(t, view, "total_units") != strconv.Itoa(vs.UnitsTotal)+"\n" || readView(t, view, "state") != "working\n" {
		t.Fatal("node files disagree with snapshot.json")
	}
	for _, g := range vs.GPUs {
		dir := filepath.Join("gpus", strconv.Itoa(g.Index))
		for name, want := range map[string]string{
			"uuid": g.UUID, "name": g.Name, "state": g.State, "eligible": strconv.FormatBool(g.Eligible),
			"units_total": strconv.Itoa(g.UnitsTotal), "units_used": strconv.Itoa(g.UnitsUsed),
			"units_free": strconv.Itoa(g.UnitsFree), "units_offline": strconv.Itoa(g.UnitsOffline),
			"memory_total_mib": strconv.FormatUint(g.MemoryTotalMiB, 10), "memory_held_mib": strconv.FormatUint(g.MemoryHeldMiB, 10),
		} {
			if got := readView(t, view, filepath.Join(dir, name)); got != want+"\n" {
				t.Errorf("%s/%s = %q, want %q", dir, name, got, want)
			}
		}
		target, err := os.Readlink(filepath.Join(view, "gpus", g.UUID))
		if err != nil || target != strconv.Itoa(g.Index) {
			t.Errorf("gpus/%s -> %q %v", g.UUID, target, err)
		}
	}
	if !strings.Contains(readView(t, view, "metrics"), "gpulet_units{") {
		t.Error("metrics file lacks gpulet_units")
	}

	// A lease appears in the view, with the daemon's figures, and goes away.
	l, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, GPU: "1", TTL: "1m"})
	if err != nil {
		t.Fatal(err)
	}
	if got := readView(t, view, "gpus/1/units_used"); got != "1\n" {
		t.Fatalf("units_used after lease %q", got)
	}
	var vl api.Lease
	if err := json.Unmarshal([]byte(readView(t, view, "leases/"+l.ID)), &vl); err != nil || vl.ID != l.ID || vl.GPU.Index != 1 {
		t.Fatalf("leases/%s: %+v %v", l.ID, vl, err)
	}
	fi, err := os.Stat(filepath.Join(view, "leases", l.ID))
	if err != nil || fi.Mode().Perm() != 0o400 {
		t.Fatalf("lease file mode %v %v", fi.Mode(), err)
	}
	d.Client.Release(e2e.Ctx(t), l.ID)
	if _, err := os.Stat(filepath.Join(view, "leases", l.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("released lease still in the view: %v", err)
	}

	// Read-only.
	if err := os.WriteFile(filepath.Join(view, "free_units"), []byte("99\n"), 0o644); !errors.Is(err, syscall.EROFS) && !errors.Is(err, syscall.EACCES) {
		t.Fatalf("write: %v", err)
	}
	if err := os.WriteFile(filepath.Join(view, "new"), nil, 0o644); err == nil {
		t.Fatal("created a file in the view")
	}

	// After kill -9 of gpuletd its view process unmounts (its standard input
	// ends), and the next start mounts again.
	d.Kill9()
	testutil.Eventually(t, "the view process to unmount after gpuletd died", func() bool { return !isMounted(t, view) })
	d.Restart()
	if got := readView(t, view, "total_units"); got != "32\n" {
		t.Fatalf("after restart total_units %q", got)
	}
	// A clean stop unmounts.
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	if isMounted(t, view) {
		t.Fatal("view still mounted after a clean stop")
	}
}

func TestUnusableMountPointIsNotFatal(t *testing.T) {
	e2e.RequireFUSE(t)
	file := filepath.Join(t.TempDir(), "not-a-dir")
	os.WriteFile(file, nil, 0o644)
	d := e2e.Start(t, "--mount", file)
	s, err := d.Client.Snapshot(e2e.Ctx(t))
	if err != nil || s.View == nil || s.View.Mounted || s.View.Error == "" {
		t.Fatalf("view status %+v %v", s.View, err)
	}
	// Tried again now and then: once the mount point is put right, the view
	// comes up, and the failure was logged once.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(file, 0o755); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the view to come up", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.View != nil && s.View.Mounted && isMounted(t, file)
	})
	if got := readView(t, file, "total_units"); got != "32\n" {
		t.Fatalf("total_units %q", got)
	}
	if n := strings.Count(d.Log.String(), "the FUSE view is not available"); n != 1 {
		t.Fatalf("the failure was logged %d times:\n%s", n, d.Log.String())
	}
}

// viewProcess finds gpuletd's view process: its child started with
// "view-process".
func viewProcess(t *testing.T, d *e2e.Daemon) int {
	t.Helper()
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", d.Pid()))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, field := range strings.Fields(string(b)) {
			cmdline, _ := os.ReadFile("/proc/" + field + "/cmdline")
			if args := strings.Split(string(cmdline), "\x00"); len(args) > 1 && args[1] == "view-process" {
				pid, _ := strconv.Atoi(field)
				return pid
			}
		}
	}
	t.Fatal("gpuletd has no view process")
	return 0
}

// A view process that dies is started again: the view comes back, and the
// snapshot says what happened meanwhile.
func TestViewProcessIsStartedAgain(t *testing.T) {
	e2e.RequireFUSE(t)
	view := filepath.Join(t.TempDir(), "view")
	d := e2e.Start(t, "--mount", view)
	old := viewProcess(t, d)
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the snapshot to say the view process ended", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.View != nil && !s.View.Mounted && strings.Contains(s.View.Error, "view process ended")
	})
	testutil.Eventually(t, "the view to come back", func() bool {
		b, err := os.ReadFile(filepath.Join(view, "total_units"))
		return err == nil && string(b) == "32\n"
	})
	s, err := d.Client.Snapshot(e2e.Ctx(t))
	if err != nil || s.View == nil || !s.View.Mounted {
		t.Fatalf("view status after the restart %+v %v", s.View, err)
	}
	if now := viewProcess(t, d); now == old {
		t.Fatalf("the view process is still %d", now)
	}
}
