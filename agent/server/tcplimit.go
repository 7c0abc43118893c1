package server

import (
	"log/slog"
	"net"

	"golang.org/x/time/rate"

	"github.com/gpulet/gpulet/internal/connlimit"
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
	g := connlimit.NewGauge()
	if ll, ok := local.(*limitListener); ok {
		g = ll.gauge
	}
	return connlimit.LimitTCP(ln, connlimit.TCPLimits{
		MaxConns: total, MaxConnsPerAddr: perAddr,
		Reserve: tcpReserve, Gauge: g,
		Pace: rate.NewLimiter(tcpAcceptsPerSecond, tcpAcceptBurst),
		Port: "--listen", MaxConnsFlag: "--listen-max-conns", MaxConnsPerAddrFlag: "--listen-max-conns-per-addr",
		ReservedFor: "the Unix socket and the daemon's own work",
		Log:         log,
	})
}
