package server

import (
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/internal/procfs"
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

// Counting the open descriptors reads /proc/self/fd, about a microsecond a
// descriptor: too dear for every accept when thousands are open, since a
// caller decides how often it connects. So a count is reused for a while,
// moved by the connections accepted and closed since, which are what
// callers change; the reserve covers what the daemon itself opens meanwhile.
const (
	fdCountEvery = 250 * time.Millisecond
	// fdCountNear is how often to count when the estimate is within twice
	// the reserve of the limit.
	fdCountNear = 20 * time.Millisecond
)

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
		fdUsage: fdUsage, now: time.Now,
		countEvery: fdCountEvery, countNear: fdCountNear,
		conns: map[uint32]int{},
	}
	l.credOf = l.readCred
	return l
}

type limitListener struct {
	net.Listener
	perUID  int
	refused *ratelog.Limiter
	// fdUsage returns the open descriptors and the soft limit on them.
	fdUsage func() (open int, limit uint64, err error)
	// credOf reads a connection's SO_PEERCRED (readCred; tests change it).
	credOf                func(*net.UnixConn) (*unix.Ucred, error)
	now                   func() time.Time
	countEvery, countNear time.Duration

	// Accept's own, as it is not called concurrently: the last count of
	// open descriptors, when it was made, the limit then, and how many
	// connections were open at that time.
	counted      time.Time
	countedOpen  int
	countedLimit uint64
	countedConns int

	mu sync.Mutex // guards conns and total
	// conns counts the open connections of each capped uid; total those of
	// everyone.
	conns map[uint32]int
	total int
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
	l.mu.Lock()
	conns := l.total
	l.mu.Unlock()
	// The new connection is open but not yet among conns.
	open := l.countedOpen + (conns + 1 - l.countedConns)
	reserve := uint64(min(fdReserve, l.countedLimit/4))
	age := l.now().Sub(l.counted)
	if l.counted.IsZero() || age >= l.countEvery || (uint64(open)+2*reserve > l.countedLimit && age >= l.countNear) {
		n, limit, err := l.fdUsage()
		if err != nil {
			// Most likely no descriptor was left to count with.
			l.refused.Log(slog.LevelWarn, "connection refused: cannot count open file descriptors", "err", err)
			return false
		}
		l.counted, l.countedOpen, l.countedLimit, l.countedConns = l.now(), n-1, limit, conns
		open, reserve = n, uint64(min(fdReserve, limit/4))
	}
	if uint64(open)+reserve <= l.countedLimit {
		return true
	}
	l.refused.Log(slog.LevelWarn, "connection refused: open file descriptors are near the limit, the rest is kept for the daemon's own work", "open", open, "limit", l.countedLimit, "reserve", reserve)
	return false
}

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
	l.total++
	if capped {
		l.conns[cred.Uid]++
	}
	return &peerConn{UnixConn: c, cred: *cred, release: func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.total--
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

// fdUsage counts this process's open file descriptors and reads the soft
// limit on them.
func fdUsage() (int, uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, 0, err
	}
	n, err := procfs.OpenDescriptors()
	return n, lim.Cur, err
}
