package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// openToOthers lets other users reach the daemon's folder, which t.TempDir
// makes private to root.
func openToOthers(t *testing.T, d *e2e.Daemon) {
	t.Helper()
	for _, p := range []string{filepath.Dir(d.Dir), d.Dir} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLedgerClosedToOthersAndSweptOfJunk: a user outside the socket group can
// put nothing in the ledger; what root plants at unit names without being a
// FIFO is removed within a couple of sample intervals, never followed, logged
// once with its owner, and leasing goes on.
func TestLedgerClosedToOthersAndSweptOfJunk(t *testing.T) {
	sock := e2e.NewGroup(t)
	otherGroup := e2e.NewGroup(t)
	other := e2e.NewUser(t, otherGroup)
	d := e2e.Start(t, "--socket-group", sock.Name, "--sample-interval", "100ms", "--sim-gpus", "1xT4", "--clients-per-instance", "4")
	openToOthers(t, d)
	s, err := d.Client.Snapshot(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(d.RunDir, "units", s.GPUs[0].UUID, "0")
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil || st.Mode&0o7777 != 0o1770 || st.Gid != sock.GID || st.Uid != 0 {
		t.Fatalf("instance folder mode %#o owner %d:%d, want 1770 0:%d: %v", st.Mode&0o7777, st.Uid, st.Gid, sock.GID, err)
	}

	cmd := exec.Command(copyForOthers(t, os.Args[0]))
	cmd.Env = append(os.Environ(), helperRoleEnv+"=intrude", "GPULET_E2E_DIR="+dir)
	out, err := other.Command(cmd).CombinedOutput()
	if err != nil {
		t.Fatalf("intruder: %v\n%s", err, out)
	}
	want := "fifo=permission denied|file=permission denied|symlink=permission denied|folder=permission denied|temp=permission denied|list=permission denied"
	if got := strings.ReplaceAll(strings.TrimSpace(string(out)), "\n", "|"); got != want {
		t.Fatalf("as a user outside the socket group:\n%s\nwant:\n%s", got, strings.ReplaceAll(want, "|", "\n"))
	}
	run := exec.Command(copyForOthers(t, e2e.Bin("gpurun")), "--offline", "--", "true")
	run.Env = append(os.Environ(), "GPULET_RUN_DIR="+d.RunDir)
	msg, code := e2e.Output(t, other.Command(run))
	if code != 125 || !strings.Contains(msg, "permission denied") || !strings.Contains(msg, "--socket-group") {
		t.Fatalf("gpurun --offline outside the socket group: exit %d %q", code, msg)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("the intruder left %v", ents)
	}

	// Root plants junk at every unit name: a file, a symlink to a secret, a
	// folder holding a symlink to a folder outside, another file.
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	planted := time.Now()
	for _, err := range []error{
		os.WriteFile(filepath.Join(dir, "unit-0"), []byte("x"), 0o644),
		os.Symlink(secret, filepath.Join(dir, "unit-1")),
		os.Mkdir(filepath.Join(dir, "unit-2"), 0o755),
		os.Symlink(outside, filepath.Join(dir, "unit-2", "out")),
		os.WriteFile(filepath.Join(dir, "unit-3"), nil, 0o644),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	for {
		ents, _ := os.ReadDir(dir)
		if len(ents) == 0 {
			break
		}
		if time.Since(planted) > 2*time.Second {
			t.Fatalf("junk still there after 20 sample intervals: %v", ents)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("junk removed %v after it was planted (sample interval 100ms)", time.Since(planted).Round(time.Millisecond))
	for i := 0; i < 4; i++ {
		if _, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"}); err != nil {
			t.Fatalf("lease %d after the sweep: %v", i, err)
		}
	}
	if b, err := os.ReadFile(secret); err != nil || string(b) != "keep" {
		t.Fatalf("symlink target: %q %v", b, err)
	}
	if ents, err := os.ReadDir(outside); err != nil || len(ents) != 1 {
		t.Fatalf("folder outside: %v %v", ents, err)
	}
	for i, typ := range []string{"file", "symlink", "folder", "file"} {
		line := fmt.Sprintf("path=%s type=%s uid=0", filepath.Join(dir, "unit-"+strconv.Itoa(i)), typ)
		if n := strings.Count(d.Log.String(), line); n != 1 {
			t.Fatalf("%q logged %d times:\n%s", line, n, d.Log.String())
		}
	}
}

// TestSocketGroupMemberClaimsOffline: a member of the socket group claims a
// unit offline with gpurun; the daemon counts it, the claim's FIFO is the
// member's, and the unit comes back when the command ends.
func TestSocketGroupMemberClaimsOffline(t *testing.T) {
	sock := e2e.NewGroup(t)
	own := e2e.NewGroup(t)
	member := e2e.NewUser(t, own)
	d := e2e.Start(t, "--socket-group", sock.Name, "--sim-gpus", "1xT4", "--clients-per-instance", "2")
	openToOthers(t, d)
	run := exec.Command(copyForOthers(t, e2e.Bin("gpurun")), "--offline", "--", "sh", "-c", "echo $GPULET_LEASE_ID; exec sleep 300")
	run.Env = append(os.Environ(), "GPULET_RUN_DIR="+d.RunDir)
	member.Command(run, sock)
	out, err := run.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	run.Stderr = os.Stderr
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	defer run.Process.Kill()
	if line := readLine(t, out); line != "offline" {
		t.Fatalf("command saw GPULET_LEASE_ID %q", line)
	}
	var uuid string
	var byUID map[string]int
	testutil.Eventually(t, "the member's claim counted", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		if err == nil {
			uuid, byUID = s.GPUs[0].UUID, s.GPUs[0].OfflineByUID
		}
		return err == nil && s.GPUs[0].UnitsOffline == 1
	})
	if want := map[string]int{fmt.Sprint(member.UID): 1}; fmt.Sprint(byUID) != fmt.Sprint(want) {
		t.Fatalf("offline_by_uid %v, want %v", byUID, want)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(d.RunDir, "units", uuid, "0", "unit-0"), &st); err != nil || st.Uid != member.UID || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Fatalf("claim FIFO owner %d mode %#o, want a FIFO of uid %d: %v", st.Uid, st.Mode, member.UID, err)
	}
	// The other unit still leases; the claimed one does not.
	if _, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"}); err == nil {
		t.Fatal("the claimed unit was leased")
	}
	run.Process.Kill()
	run.Wait()
	testutil.Eventually(t, "the claim freed", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.GPUs[0].UnitsOffline == 0
	})
}
