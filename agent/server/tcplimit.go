package server

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"sync"

	"golang.org/x/time/rate"

	"github.com/gpulet/gpulet/internal/ratelog"
)

// Defaults of --listen-max-conns and --listen-max-conns-per-addr: pollers
// (a Prometheus, a scheduler's long polls) need a few connections each.
const (
	DefaultTCPMaxConns        = 512
	DefaultTCPMaxConnsPerAddr = 32
)

// TCP connections are accepted at most tcpAcceptsPerSecond a second, in
// bursts of up to tcpAcceptBurst: pollers connect once and keep their
// connection, while a flood of connection attempts then waits in the
// kernel's backlog, costing gpuletd nothing, instead of taking CPU from the
// Unix socket's callers to be accepted and closed.
const (
	tcpAcceptsPerSecond = 500
	tcpAcceptBurst      = 64
)

// tcpReserve is the descriptors --listen leaves free: twice what the Unix
// socket leaves, so that between the two lies a band of descriptors that
// only local callers may take. Whatever TCP peers do, the Unix socket still
// accepts while the daemon has that band.
func tcpReserve(limit uint64) uint64 { return 2 * unixReserve(limit) }

// LimitTCPListener wraps --listen's listener: it closes at once a connection
// past total open connections, past perAddr from one remote address, or
// that would leave fewer free descriptors than tcpReserve. local, when it
// is what LimitListener returned for the Unix socket, shares its count of
// descriptors, so that each listener sees the other's connections.
func LimitTCPListener(ln net.Listener, total, perAddr int, local net.Listener, log *slog.Logger) net.Listener {
	g := newFDGauge()
	if ll, ok := local.(*limitListener); ok {
		g = ll.fdGauge
	}
	return &tcpLimitListener{
		Listener: ln, total: total, perAddr: perAddr, fdGauge: g,
		pace:    rate.NewLimiter(tcpAcceptsPerSecond, tcpAcceptBurst),
		refused: ratelog.New(log, "refused TCP connections", refusalsPerSecond, nil),
		conns:   map[netip.Addr]int{},
	}
}

type tcpLimitListener struct {
	net.Listener
	total, perAddr int
	refused        *ratelog.Limiter
	pace           *rate.Limiter
	*fdGauge

	mu sync.Mutex // guards conns and open
	// conns counts the open connections of each remote address, open all
	// of them.
	conns map[netip.Addr]int
	open  int
}

// Accept returns the next connection within the limits, closing the others.
func (l *tcpLimitListener) Accept() (net.Conn, error) {
	for {
		// Never fails: no deadline, and a burst of 1 or more.
		l.pace.Wait(context.Background())
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if lc := l.admit(c); lc != nil {
			return lc, nil
		}
		c.Close()
	}
}

func (l *tcpLimitListener) admit(c net.Conn) net.Conn {
	addr := remoteAddr(c)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.open >= l.total:
		l.refused.Log(slog.LevelWarn, "TCP connection refused: --listen has as many open connections as it may (--listen-max-conns)", "remote", addr, "max", l.total)
		return nil
	case l.conns[addr] >= l.perAddr:
		l.refused.Log(slog.LevelWarn, "TCP connection refused: the address has as many open connections as one may (--listen-max-conns-per-addr)", "remote", addr, "max", l.perAddr)
		return nil
	}
	ok, open, limit, reserve, err := l.left(tcpReserve)
	if !ok {
		l.refused.Log(slog.LevelWarn, "TCP connection refused: open file descriptors are near the limit, the rest is kept for the Unix socket and the daemon's own work", "remote", addr, "open", open, "limit", limit, "reserve", reserve, "err", err)
		return nil
	}
	l.open++
	l.conns[addr]++
	l.add(1)
	return &countedConn{Conn: c, release: func() {
		l.add(-1)
		l.mu.Lock()
		defer l.mu.Unlock()
		l.open--
		if l.conns[addr]--; l.conns[addr] <= 0 {
			delete(l.conns, addr)
		}
	}}
}

// remoteAddr is c's remote IP address, IPv4 in IPv6 unmapped so that one
// host counts once.
func remoteAddr(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// countedConn gives its place back at its first Close.
type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
