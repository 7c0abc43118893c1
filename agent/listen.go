package agent

import (
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
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
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("--socket: %w", err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, fmt.Errorf("--socket: %w", err)
	}
	a.chownSocket(path)
	return ln, nil
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
