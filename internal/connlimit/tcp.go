package connlimit

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"sync"

	"golang.org/x/time/rate"

	"github.com/gpulet/gpulet/internal/ratelog"
)

// refusalsPerSecond bounds the log lines about refused connections.
const refusalsPerSecond = 5

// TCPLimits are what a TCP listener admits, and how it says what it
// refused.
type TCPLimits struct {
	// MaxConns caps the connections open at once, MaxConnsPerAddr those
	// from one remote address; 0: no cap (descriptors still bound both).
	MaxConns, MaxConnsPerAddr int
	// Reserve is the descriptors to leave free under a soft limit of
	// limit: a connection that would leave fewer is closed.
	Reserve func(limit uint64) uint64
	// Gauge counts the descriptors; one shared with other listeners
	// counts their connections too. Nil: a gauge of its own.
	Gauge *Gauge
	// Pace, when set, is waited on before each accept, so that a flood of
	// connection attempts waits in the kernel's backlog.
	Pace *rate.Limiter
	// Port, MaxConnsFlag and MaxConnsPerAddrFlag name the port and the
	// flags of the caps in the log lines about refusals; ReservedFor says
	// what the reserve of descriptors is kept for.
	Port, MaxConnsFlag, MaxConnsPerAddrFlag, ReservedFor string
	Log                                                  *slog.Logger
}

// LimitTCP wraps ln: it closes at once a connection past lim's caps or
// that would leave fewer free descriptors than lim.Reserve. Refusals are
// logged within a budget, since peers cause them.
func LimitTCP(ln net.Listener, lim TCPLimits) net.Listener {
	if lim.Gauge == nil {
		lim.Gauge = NewGauge()
	}
	return &tcpListener{
		Listener: ln, TCPLimits: lim,
		refused: ratelog.New(lim.Log, "refused TCP connections", refusalsPerSecond, nil),
		conns:   map[netip.Addr]int{},
	}
}

type tcpListener struct {
	net.Listener
	TCPLimits
	refused *ratelog.Limiter

	mu sync.Mutex // guards conns and open
	// conns counts the open connections of each remote address when they
	// are capped; open counts all of them.
	conns map[netip.Addr]int
	open  int
}

// Accept returns the next connection within the limits, closing the others.
func (l *tcpListener) Accept() (net.Conn, error) {
	for {
		if l.Pace != nil {
			// Never fails: no deadline, and a burst of 1 or more.
			l.Pace.Wait(context.Background())
		}
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

func (l *tcpListener) admit(c net.Conn) net.Conn {
	addr := remoteAddr(c)
	perAddr := l.MaxConnsPerAddr > 0
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.MaxConns > 0 && l.open >= l.MaxConns:
		l.refused.Log(slog.LevelWarn, "TCP connection refused: "+l.Port+" has as many open connections as it may ("+l.MaxConnsFlag+")", "remote", addr, "max", l.MaxConns)
		return nil
	case perAddr && l.conns[addr] >= l.MaxConnsPerAddr:
		l.refused.Log(slog.LevelWarn, "TCP connection refused: the address has as many open connections as one may ("+l.MaxConnsPerAddrFlag+")", "remote", addr, "max", l.MaxConnsPerAddr)
		return nil
	}
	ok, open, limit, reserve, err := l.Gauge.Left(l.Reserve)
	if !ok {
		l.refused.Log(slog.LevelWarn, "TCP connection refused: open file descriptors are near the limit, the rest is kept for "+l.ReservedFor, "remote", addr, "open", open, "limit", limit, "reserve", reserve, "err", err)
		return nil
	}
	l.open++
	if perAddr {
		l.conns[addr]++
	}
	l.Gauge.Add(1)
	return &countedConn{Conn: c, release: func() {
		l.Gauge.Add(-1)
		l.mu.Lock()
		defer l.mu.Unlock()
		l.open--
		if perAddr {
			if l.conns[addr]--; l.conns[addr] <= 0 {
				delete(l.conns, addr)
			}
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
