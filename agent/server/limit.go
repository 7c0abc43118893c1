package server

import (
	"log/slog"
	"net"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/internal/connlimit"
	"github.com/gpulet/gpulet/internal/ratelog"
)

// fdReserve is how many file descriptors the listener leaves to the daemon's
// own work (MPS probes and their pipes, the journal, pidfds of new leases):
// a connection that arrives with fewer free is closed at once. It is a
// quarter of the limit when that is smaller, so that a daemon run with a
// tiny limit still serves some connections.
const fdReserve = 64

// refusalsPerSecond bounds the log lines about refused connections.
const refusalsPerSecond = 5

// LimitListener wraps the API's listener so that no caller can take the
// daemon's file descriptors: it closes at once a connection whose uid already
// has perUID open (root is not capped; 0: no cap), and any connection that
// arrives when the open descriptors are within the reserve of the limit.
// Refusals are logged within a budget, since callers cause them. The
// connections it returns carry the SO_PEERCRED read at accept, which the
// server's identity then uses.
func LimitListener(ln net.Listener, perUID int, log *slog.Logger) net.Listener {
	l := &limitListener{
		Listener: ln, perUID: perUID,
		refused: ratelog.New(log, "refused connections", refusalsPerSecond, nil),
		gauge:   connlimit.NewGauge(),
		conns:   map[uint32]int{},
	}
	l.credOf = l.readCred
	return l
}

type limitListener struct {
	net.Listener
	perUID  int
	refused *ratelog.Limiter
	// credOf reads a connection's SO_PEERCRED (readCred; tests change it).
	credOf func(*net.UnixConn) (*unix.Ucred, error)
	// gauge counts this listener's connections with --listen's.
	gauge *connlimit.Gauge

	mu sync.Mutex // guards conns
	// conns counts the open connections of each capped uid.
	conns map[uint32]int
}

// Accept returns the next connection that is within the limits, closing the
// others.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uc, ok := c.(*net.UnixConn)
		if !ok {
			// The API is served only on a Unix socket.
			return c, nil
		}
		if !l.fdsLeft() {
			c.Close()
			continue
		}
		if lc := l.admit(uc); lc != nil {
			return lc, nil
		}
		uc.Close()
	}
}

// fdsLeft reports whether the daemon has more than the reserve of descriptors
// free, the new connection's included.
func (l *limitListener) fdsLeft() bool {
	ok, open, limit, reserve, err := l.gauge.Left(unixReserve)
	switch {
	case err != nil:
		// Most likely no descriptor was left to count with.
		l.refused.Log(slog.LevelWarn, "connection refused: cannot count open file descriptors", "err", err)
	case !ok:
		l.refused.Log(slog.LevelWarn, "connection refused: open file descriptors are near the limit, the rest is kept for the daemon's own work", "open", open, "limit", limit, "reserve", reserve)
	}
	return ok
}

// unixReserve is the descriptors the Unix socket leaves free: fdReserve, or
// a quarter of a smaller limit.
func unixReserve(limit uint64) uint64 { return min(fdReserve, limit/4) }

// admit counts c against its uid, or returns nil when the uid is at its cap
// or the peer cannot be told.
func (l *limitListener) admit(c *net.UnixConn) *peerConn {
	cred, err := l.credOf(c)
	if err != nil {
		l.refused.Log(slog.LevelWarn, "connection refused: cannot read the caller's credentials", "err", err)
		return nil
	}
	capped := cred.Uid != 0 && l.perUID > 0
	l.mu.Lock()
	defer l.mu.Unlock()
	if capped && l.conns[cred.Uid] >= l.perUID {
		l.refused.Log(slog.LevelWarn, "connection refused: the user has as many open connections as one user may (--max-conns-per-uid)", "uid", cred.Uid, "pid", cred.Pid, "max", l.perUID)
		return nil
	}
	l.gauge.Add(1)
	if capped {
		l.conns[cred.Uid]++
	}
	return &peerConn{UnixConn: c, cred: *cred, release: func() {
		l.gauge.Add(-1)
		l.mu.Lock()
		defer l.mu.Unlock()
		if capped {
			if l.conns[cred.Uid]--; l.conns[cred.Uid] <= 0 {
				delete(l.conns, cred.Uid)
			}
		}
	}}
}

func (l *limitListener) readCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	return peerCred(rc)
}

// open is the number of connections uid holds now.
func (l *limitListener) open(uid uint32) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[uid]
}

// peerConn is an accepted connection with the credentials read at accept; its
// first Close gives its place back.
type peerConn struct {
	*net.UnixConn
	cred    unix.Ucred
	once    sync.Once
	release func()
}

func (c *peerConn) Close() error {
	err := c.UnixConn.Close()
	c.once.Do(c.release)
	return err
}
