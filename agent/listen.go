package agent

import (
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/gpulet/gpulet/systemd"
)

// listen returns the API listener: the one systemd passed, or the socket at
// --socket, replacing a stale socket file and refusing a live one.
func (a *Agent) listen() (net.Listener, error) {
	if ln := systemd.Listener(); ln != nil {
		a.log.Info("using the socket passed by systemd", "addr", ln.Addr().String())
		return ln, nil
	}
	path := a.cfg.Socket
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("--socket: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("--socket %s exists and is not a socket; refusing to replace it", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("another gpuletd is already serving %s", path)
		}
		a.log.Info("removing stale socket left by an earlier run", "socket", path)
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale socket: %w", err)
		}
	}
	ln, err := listenUnix(path, 0o660)
	if err != nil {
		return nil, fmt.Errorf("--socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	// Under a umask that takes group write, the socket was made narrower than
	// asked: the group gets it now (narrower never let anyone in early).
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, fmt.Errorf("--socket: %w", err)
	}
	a.chownSocket(path)
	return ln, nil
}

// listenUnix listens on a Unix socket made at path with mode perm, less the
// umask, from its first moment: net.Listen would make it with 0777 less the
// umask, and under a loose one (0000, 0002) anyone could connect, and keep
// the connection, before a chmod after it. A socket's mode at bind(2) is its
// inode's, which fchmod sets beforehand.
func listenUnix(path string, perm os.FileMode) (*net.UnixListener, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close() // FileListener keeps a copy of the descriptor
	if err := syscall.Fchmod(fd, uint32(perm.Perm())); err != nil {
		return nil, fmt.Errorf("setting the socket's mode: %w", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		return nil, &net.OpError{Op: "listen", Net: "unix", Addr: &net.UnixAddr{Name: path, Net: "unix"}, Err: os.NewSyscallError("bind", err)}
	}
	if err := syscall.Listen(fd, syscall.SOMAXCONN); err != nil {
		os.Remove(path)
		return nil, os.NewSyscallError("listen", err)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	return ln.(*net.UnixListener), nil
}

func (a *Agent) chownSocket(path string) {
	if a.cfg.SocketGroup == "" {
		return
	}
	g, err := user.LookupGroup(a.cfg.SocketGroup)
	if err != nil {
		a.log.Warn("--socket-group not found: the socket stays in the daemon's group, so only its user (and root) can use it", "group", a.cfg.SocketGroup)
		return
	}
	gid, _ := strconv.Atoi(g.Gid)
	if err := os.Chown(path, -1, gid); err != nil {
		a.log.Warn("cannot give the socket to --socket-group", "group", a.cfg.SocketGroup, "err", err)
	}
}

func (a *Agent) adminGID() int {
	if a.cfg.AdminGroup == "" {
		return -1
	}
	g, err := user.LookupGroup(a.cfg.AdminGroup)
	if err != nil {
		a.log.Warn("--admin-group not found; only root acts as admin", "group", a.cfg.AdminGroup)
		return -1
	}
	gid, _ := strconv.Atoi(g.Gid)
	return gid
}
