package client

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"

	"github.com/gpulet/gpulet/api"
)

// What a client tells its user when it cannot reach gpuletd: the cause, and
// what fixes it.

// ErrPermission means the caller may not connect to gpuletd's socket: its
// user is not in the socket's group (or not yet, in this login). It also
// matches ErrNoDaemon.
var ErrPermission = errors.New("permission denied")

// MaxSocketPath is the longest path a Unix socket may have.
const MaxSocketPath = api.MaxSocketPath

// ErrSocketPathTooLong is a socket path longer than MaxSocketPath; it also
// matches ErrNoDaemon.
var ErrSocketPathTooLong = errors.New("socket path too long")

// CheckSocketPath refuses a socket path no Unix socket can have, naming the
// limit, so that the kernel's "invalid argument" is never what a user reads.
func CheckSocketPath(path string) error {
	if len(path) > MaxSocketPath {
		return fmt.Errorf("%w: %s is %d bytes, and a Unix socket path holds at most %d: choose a shorter one", ErrSocketPathTooLong, path, len(path), MaxSocketPath)
	}
	return nil
}

// permissionAdvice says how the caller gets into the socket's group: the
// group is the socket's own, and a user already listed in it whose login
// predates that needs a new login.
func permissionAdvice(path string) string {
	group := "gpulet"
	var gid uint32
	var st syscall.Stat_t
	if syscall.Stat(path, &st) == nil {
		gid = st.Gid
		group = strconv.FormatUint(uint64(gid), 10)
		if g, err := user.LookupGroupId(group); err == nil {
			group = g.Name
		}
	}
	if gid != 0 && inGroupDatabase(gid) && !inProcessGroups(gid) {
		return fmt.Sprintf("you are in group %s now, but this login started before: log in again (or run newgrp %s)", group, group)
	}
	return fmt.Sprintf("your user must be in the socket's group, %s: sudo usermod -aG %s $USER, then log in again", group, group)
}

// inGroupDatabase says whether the user database lists the caller in gid.
func inGroupDatabase(gid uint32) bool {
	u, err := user.LookupId(strconv.Itoa(os.Getuid()))
	if err != nil {
		return false
	}
	ids, err := u.GroupIds()
	return err == nil && slices.Contains(ids, strconv.FormatUint(uint64(gid), 10))
}

// inProcessGroups says whether this process runs with gid.
func inProcessGroups(gid uint32) bool {
	if os.Getegid() == int(gid) {
		return true
	}
	groups, err := os.Getgroups()
	return err == nil && slices.Contains(groups, int(gid))
}

// PrivateSockets are the sockets of the private gpuletd that `make run`
// starts for a user other than root, where they exist: in
// $XDG_RUNTIME_DIR/gpulet, else /tmp/gpulet-UID.
func PrivateSockets(getenv func(string) string) []string {
	var dirs []string
	if d := getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(d) {
		dirs = append(dirs, filepath.Join(d, "gpulet"))
	}
	dirs = append(dirs, fmt.Sprintf("/tmp/gpulet-%d", os.Getuid()))
	var out []string
	for _, d := range dirs {
		p := filepath.Join(d, "gpulet.sock")
		if fi, err := os.Lstat(p); err == nil && fi.Mode().Type() == os.ModeSocket {
			out = append(out, p)
		}
	}
	return out
}

// NoDaemonHint says where else a gpuletd may be when none answers at the
// default socket: a private one of `make run`'s, with the export that points
// clients at it. Empty when the socket was chosen (--socket, GPULET_SOCKET),
// or when there is none.
func (c *Client) NoDaemonHint(getenv func(string) string) string {
	if c.Socket != "" || getenv(SocketEnv) != "" {
		return ""
	}
	socks := PrivateSockets(getenv)
	if len(socks) == 0 {
		return ""
	}
	return fmt.Sprintf("a private gpuletd (make run's) has its socket at %s: export %s=%s", socks[0], SocketEnv, socks[0])
}
