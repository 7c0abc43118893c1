package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxGroups is the kernel's NGROUPS_MAX: no process has more supplementary
// groups, so SO_PEERGROUPS never needs a larger buffer.
const maxGroups = 65536

// peerCred reads SO_PEERCRED: who connected, as the kernel recorded it at
// connect.
func peerCred(rc syscall.RawConn) (*unix.Ucred, error) {
	var cred *unix.Ucred
	var err error
	if cerr := rc.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); cerr != nil {
		return nil, cerr
	}
	if err != nil {
		return nil, fmt.Errorf("SO_PEERCRED: %w", err)
	}
	return cred, nil
}

// peerGroups reads SO_PEERGROUPS: the supplementary groups the peer had at
// connect. (unix.GetsockoptString would cut the array at its first zero
// byte, which nearly every gid has.)
func peerGroups(rc syscall.RawConn) ([]uint32, error) {
	buf := make([]byte, 64*4)
	var n int
	var err error
	cerr := rc.Control(func(fd uintptr) {
		for {
			l := uint32(len(buf))
			_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_PEERGROUPS, uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&l)), 0)
			// ERANGE: the buffer is too small, and l says how large it must be.
			if e == unix.ERANGE && int(l) > len(buf) && l <= maxGroups*4 {
				buf = make([]byte, l)
				continue
			}
			if e != 0 {
				err = e
			}
			n = int(l)
			return
		}
	})
	if cerr != nil {
		return nil, cerr
	}
	if err != nil {
		return nil, fmt.Errorf("SO_PEERGROUPS: %w", err)
	}
	if n > len(buf) {
		return nil, fmt.Errorf("SO_PEERGROUPS: %d bytes, more than %d groups", n, maxGroups)
	}
	return parseGroups(buf[:n])
}

// parseGroups decodes SO_PEERGROUPS' answer: an array of gid_t (32 bits, in
// the host's byte order).
func parseGroups(b []byte) ([]uint32, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("SO_PEERGROUPS: %d bytes, not a whole number of gids", len(b))
	}
	if len(b) > maxGroups*4 {
		return nil, fmt.Errorf("SO_PEERGROUPS: more than %d groups", maxGroups)
	}
	gids := make([]uint32, len(b)/4)
	for i := range gids {
		gids[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return gids, nil
}

// errNoPeerPidfd means the kernel has no SO_PEERPIDFD (before Linux 6.5).
var errNoPeerPidfd = errors.New("SO_PEERPIDFD is not supported")

// peerPidfd reads SO_PEERPIDFD: a pidfd for the process that connected —
// exactly it, even when it has exited and its pid names another process by
// now. The caller closes it.
func peerPidfd(rc syscall.RawConn) (*os.File, error) {
	fd := -1
	var err error
	if cerr := rc.Control(func(s uintptr) { fd, err = unix.GetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_PEERPIDFD) }); cerr != nil {
		return nil, cerr
	}
	if errors.Is(err, unix.ENOPROTOOPT) {
		return nil, errNoPeerPidfd
	}
	if err != nil {
		return nil, fmt.Errorf("SO_PEERPIDFD: %w", err)
	}
	return os.NewFile(uintptr(fd), "peer-pidfd"), nil
}
