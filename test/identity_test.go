package test

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/test/e2e"
)

// TestOrdinaryUserSeesOnlyOwnLeases runs a client as uid 65534 (nobody), let in
// through the socket's group, next to a lease of root's.
func TestOrdinaryUserSeesOnlyOwnLeases(t *testing.T) {
	runAsNobody(t, nil, []string{
		"lease=ok uid=65534",
		"list=ok count=1",
		"get-other=not_found",
		"release-other=not_found",
		"sim=forbidden",
		"drain=forbidden",
		"release-own=ok",
	})
}

// TestAdminGroupMemberActsAsAdmin: nobody's group is --admin-group, so it sees
// and releases root's lease and may drain; the simulation stays root's.
func TestAdminGroupMemberActsAsAdmin(t *testing.T) {
	runAsNobody(t, []string{"--admin-group", "nogroup"}, []string{
		"lease=ok uid=65534",
		"list=ok count=2",
		"get-other=ok",
		"release-other=ok",
		"sim=forbidden",
		"drain=ok",
		"release-own=ok",
	})
}

// runAsNobody starts gpuletd with extra flags, takes a lease as root, runs the
// user role as uid 65534 against it and compares what it printed with want.
func runAsNobody(t *testing.T, extra []string, want []string) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to run a client as another user; runs as", os.Getuid())
	}
	d := e2e.Start(t, append([]string{"--socket-group", "nogroup"}, extra...)...)
	// t.TempDir folders are private to root; let the user reach the socket.
	os.Chmod(filepath.Dir(d.Dir), 0o755)
	os.Chmod(d.Dir, 0o755)
	rootLease, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(copyForOthers(t, os.Args[0]))
	cmd.Env = append(os.Environ(), helperRoleEnv+"=user", "GPULET_SOCKET="+d.Socket, "GPULET_E2E_OTHER_LEASE="+rootLease.ID)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("user client: %v\n%s", err, out)
	}
	if got := strings.Split(strings.TrimSpace(string(out)), "\n"); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("as nobody:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
	}
}

// copyForOthers copies an executable where other users may run it: the test
// binary's own folder is private to root.
func copyForOthers(t testing.TB, path string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpulet-e2e-user-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	src, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst := filepath.Join(dir, filepath.Base(path))
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, src); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}
