package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
	"testing"
)

// Group is a group a test made.
type Group struct {
	Name string
	GID  uint32
}

// User is a user a test made, with its primary group.
type User struct {
	Name     string
	UID, GID uint32
}

// NeedAccounts skips a test that must make users and groups and run processes
// as them where it cannot: it needs root, and the shadow tools. CI runs as
// root with them installed, so there these tests run.
func NeedAccounts(t testing.TB) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to make users and run processes as them; runs as uid", os.Getuid())
	}
	for _, c := range []string{"useradd", "userdel", "groupadd", "groupdel"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("%s is not installed: cannot make the users this test runs as", c)
		}
	}
}

// NewGroup makes a group with a name of its own, removed when the test ends.
func NewGroup(t testing.TB) Group {
	t.Helper()
	NeedAccounts(t)
	name := fmt.Sprintf("gpg%08x", rand.Uint32())
	if out, err := exec.Command("groupadd", name).CombinedOutput(); err != nil {
		t.Fatalf("groupadd %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() { exec.Command("groupdel", name).Run() })
	g, err := user.LookupGroup(name)
	if err != nil {
		t.Fatal(err)
	}
	gid, _ := strconv.ParseUint(g.Gid, 10, 32)
	return Group{Name: name, GID: uint32(gid)}
}

// NewUser makes a user with primary group primary, removed when the test ends
// (before the group: a group is not removed while it is a user's primary one).
func NewUser(t testing.TB, primary Group) User {
	t.Helper()
	NeedAccounts(t)
	name := fmt.Sprintf("gpu%08x", rand.Uint32())
	if out, err := exec.Command("useradd", "-M", "-N", "-g", primary.Name, "-s", "/bin/sh", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() { exec.Command("userdel", name).Run() })
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	return User{Name: name, UID: uint32(uid), GID: primary.GID}
}

// NewUserWithGroup makes a user with a primary group of its own.
func NewUserWithGroup(t testing.TB) User { return NewUser(t, NewGroup(t)) }

// Command makes cmd run as u, with u's primary group and the groups extra as
// its only supplementary groups. It keeps what else cmd's SysProcAttr sets.
func (u User) Command(cmd *exec.Cmd, extra ...Group) *exec.Cmd {
	cred := &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}
	for _, g := range extra {
		cred.Groups = append(cred.Groups, g.GID)
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = cred
	return cmd
}
