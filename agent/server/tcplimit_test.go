package server

import (
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpulet/gpulet/internal/connlimit"
	"github.com/gpulet/gpulet/internal/testutil"
)

// tcpTestListener serves --listen's limits on a loopback port, counting
// descriptors with usage, and returns its address and the accepted
// connections it holds open.
func tcpTestListener(t *testing.T, total, perAddr int, usage func() (int, uint64, error)) (string, chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skip("no loopback TCP here:", err)
	}
	// Given as the Unix socket's listener, whose gauge --listen shares.
	local := &limitListener{gauge: connlimit.NewGauge()}
	if usage != nil {
		local.gauge.Usage = usage
	}
	local.gauge.CountEvery, local.gauge.CountNear = 0, 0
	l := LimitTCPListener(ln, total, perAddr, local, slog.New(slog.DiscardHandler))
	held := testutil.HoldAccepted(t, l, ln)
	return ln.Addr().String(), held
}

// dialFrom connects to addr from the loopback address src and reports
// whether the server kept the connection.
func dialFrom(t *testing.T, src, addr string) (net.Conn, bool) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, !closedByServer(t, c)
}

func TestTCPListenerCaps(t *testing.T) {
	addr, _ := tcpTestListener(t, 5, 3, nil)
	kept := func(src string, n int) int {
		k := 0
		for range n {
			if _, ok := dialFrom(t, src, addr); ok {
				k++
			}
		}
		return k
	}
	if k := kept("127.0.0.1", 6); k != 3 {
		t.Fatalf("one address kept %d of 6 connections, want its cap of 3", k)
	}
	if k := kept("127.0.0.2", 6); k != 2 {
		t.Fatalf("a second address kept %d of 6 connections, want the 2 left of the total of 5", k)
	}
}

// A closed connection gives its place back.
func TestTCPListenerReleases(t *testing.T) {
	addr, held := tcpTestListener(t, 1, 1, nil)
	if _, ok := dialFrom(t, "127.0.0.1", addr); !ok {
		t.Fatal("the first connection was refused")
	}
	if _, ok := dialFrom(t, "127.0.0.1", addr); ok {
		t.Fatal("a second connection past the cap of 1 was kept")
	}
	(<-held).Close()
	testutil.Eventually(t, "a connection once the first closed", func() bool {
		_, ok := dialFrom(t, "127.0.0.1", addr)
		return ok
	})
}

// TCP stops twice as far from the descriptor limit as the Unix socket does,
// so that the band between is left to local callers.
func TestTCPListenerKeepsTheUnixBand(t *testing.T) {
	const limit = 1024
	// Counted with the new connection open: limit-128 is the last kept.
	var open atomic.Int64
	open.Store(limit - 2*fdReserve)
	addr, _ := tcpTestListener(t, 100, 100, func() (int, uint64, error) { return int(open.Load()), limit, nil })
	if _, ok := dialFrom(t, "127.0.0.1", addr); !ok {
		t.Fatalf("refused with %d of %d descriptors open", open.Load(), limit)
	}
	open.Add(1)
	if _, ok := dialFrom(t, "127.0.0.1", addr); ok {
		t.Fatalf("kept with %d of %d descriptors open: inside the Unix socket's band", open.Load(), limit)
	}
	if uint64(open.Load())+unixReserve(limit) > limit {
		t.Fatal("the Unix socket would refuse too: no band between the two")
	}
}

// Connections are accepted at a bounded pace, so that a flood of attempts
// waits in the kernel's backlog instead of taking gpuletd's CPU: 200 take at
// least the time the pace gives past its burst.
func TestTCPListenerPacesAccepts(t *testing.T) {
	const n = 200
	addr, held := tcpTestListener(t, n+10, n+10, nil)
	start := time.Now()
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	for range n {
		(<-held).Close()
	}
	elapsed := time.Since(start)
	if least := time.Duration(n-tcpAcceptBurst) * time.Second / tcpAcceptsPerSecond; elapsed < least*9/10 {
		t.Fatalf("%d connections accepted in %v, faster than the pace allows (%v)", n, elapsed, least)
	}
}
