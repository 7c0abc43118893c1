package test

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gpulet/gpulet/test/e2e"
)

// uniqueName is a user or group name no other test run uses.
func uniqueName(t testing.TB) string {
	t.Helper()
	b := make([]byte, 5)
	rand.Read(b)
	return "gplt" + hex.EncodeToString(b)
}

// needUserTools skips a test that must create users when this is not root or
// the shadow tools are missing.
func needUserTools(t testing.TB) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to create users and run processes as them; runs as", os.Getuid())
	}
	for _, tool := range []string{"useradd", "userdel", "groupadd", "groupdel"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: cannot create the test's users", tool)
		}
	}
}

// addGroup creates a group, removed when the test ends.
func addGroup(t testing.TB) string {
	t.Helper()
	name := uniqueName(t)
	if out, err := exec.Command("groupadd", name).CombinedOutput(); err != nil {
		t.Fatalf("groupadd %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() { exec.Command("groupdel", name).Run() })
	return name
}

// testUser is a user created for one test.
type testUser struct {
	name     string
	uid, gid uint32
	groups   []uint32
}

// addUser creates a user (with a group of its own) that is also a member of
// groups, removed when the test ends.
func addUser(t testing.TB, groups ...string) testUser {
	t.Helper()
	name := uniqueName(t)
	args := []string{"--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin"}
	if len(groups) > 0 {
		args = append(args, "--groups", strings.Join(groups, ","))
	}
	if out, err := exec.Command("useradd", append(args, name)...).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Logf("userdel %s: %v: %s", name, err, out)
		}
		exec.Command("groupdel", name).Run()
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	tu := testUser{name: name, uid: atou32(t, u.Uid), gid: atou32(t, u.Gid)}
	gids, err := u.GroupIds()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gids {
		tu.groups = append(tu.groups, atou32(t, g))
	}
	return tu
}

func atou32(t testing.TB, s string) uint32 {
	t.Helper()
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(n)
}

// command runs name as the user, with its groups as the system lists them.
func (u testUser) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}}
	return cmd
}

// role runs this test binary as the user in a helper role against d.
func (u testUser) role(t *testing.T, d *e2e.Daemon, role string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := u.command(copyForOthers(t, os.Args[0]))
	cmd.Env = append(append(os.Environ(), helperRoleEnv+"="+role, "GPULET_SOCKET="+d.Socket), env...)
	return cmd
}

// startForUsers starts gpuletd with its socket in group sockGroup and reachable
// by other users.
func startForUsers(t *testing.T, sockGroup string, extra ...string) *e2e.Daemon {
	t.Helper()
	d := e2e.Start(t, append([]string{"--socket-group", sockGroup}, extra...)...)
	// t.TempDir folders are private to root; let the users reach the socket.
	os.Chmod(filepath.Dir(d.Dir), 0o755)
	os.Chmod(d.Dir, 0o755)
	return d
}
