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
	"github.com/gpulet/gpulet/internal/e2e"
)

// TestOrdinaryUserSeesOnlyOwnLeases runs a client as uid 65534 (nobody), let in
// through the socket's group, next to a lease of root's.
func TestOrdinaryUserSeesOnlyOwnLeases(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a client as another user; runs as", os.Getuid())
	}
	d := e2e.Start(t, "--socket-group", "nogroup")
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
	want := []string{
		"lease=ok uid=65534",
		"list=ok count=1",
		"get-other=not_found",
		"release-other=not_found",
		"sim=forbidden",
		"drain=forbidden",
		"release-own=ok",
	}
	if got := strings.Split(strings.TrimSpace(string(out)), "\n"); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("as nobody:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
	}
	// Root still sees, and holds, its own lease.
	if _, err := d.Client.GetLease(e2e.Ctx(t), rootLease.ID); err != nil {
		t.Fatal(err)
	}
	all, _ := d.Client.Leases(e2e.Ctx(t))
	if len(all) != 1 {
		t.Fatalf("root lists %d leases, want 1", len(all))
	}
}

// copyForOthers copies an executable where other users may run it: the test
// binary's own folder is private to root.
func copyForOthers(t *testing.T, path string) string {
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
