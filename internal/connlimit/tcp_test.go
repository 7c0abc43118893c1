package connlimit

import (
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpulet/gpulet/internal/testutil"
)

// serveLimited serves lim on a loopback port, counting descriptors with
// usage (the process's own when nil) at every accept, and returns its
// address and the accepted connections, held open until the test ends.
func serveLimited(t *testing.T, lim TCPLimits, usage func() (int, uint64, error)) (string, chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skip("no loopback TCP here:", err)
	}
	lim.Gauge = NewGauge()
	if usage != nil {
		lim.Gauge.Usage = usage
	}
	lim.Gauge.CountEvery, lim.Gauge.CountNear = 0, 0
	lim.Reserve = func(limit uint64) uint64 { return min(64, limit/4) }
	lim.Log = slog.New(slog.DiscardHandler)
	l := LimitTCP(ln, lim)
	held := testutil.HoldAccepted(t, l, ln)
	return ln.Addr().String(), held
}

// dial connects to addr and returns the server's side of the connection
// when the server kept it, nil when it closed it at once without a word.
func dial(t *testing.T, addr string, held chan net.Conn) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	closed := make(chan struct{})
	go func() {
		if _, err := c.Read(make([]byte, 1)); err == io.EOF {
			close(closed)
		}
	}()
	select {
	case sc := <-held:
		t.Cleanup(func() { sc.Close() })
		return sc
	case <-closed:
		return nil
	case <-time.After(10 * time.Second):
		t.Fatal("a connection neither kept nor closed in 10s")
		return nil
	}
}

// Past MaxConns a connection is closed at once; one closed gives its place
// back.
func TestLimitTCPClosesPastMaxConns(t *testing.T) {
	addr, held := serveLimited(t, TCPLimits{MaxConns: 3}, nil)
	var kept []net.Conn
	for range 5 {
		if sc := dial(t, addr, held); sc != nil {
			kept = append(kept, sc)
		}
	}
	if len(kept) != 3 {
		t.Fatalf("kept %d of 5 connections, want the cap of 3", len(kept))
	}
	kept[0].Close()
	testutil.Eventually(t, "a connection kept once one of the 3 closed", func() bool { return dial(t, addr, held) != nil })
}

// Without caps, as the collector runs behind a load balancer, one address
// opens as many connections as descriptors allow.
func TestLimitTCPWithoutCapsTakesOneAddressesMany(t *testing.T) {
	const n = 100
	addr, held := serveLimited(t, TCPLimits{}, nil)
	for i := range n {
		if dial(t, addr, held) == nil {
			t.Fatalf("connection %d of one address refused without caps", i+1)
		}
	}
}

// Whatever the caps, a connection that would leave fewer free descriptors
// than the reserve is closed; one closed makes room again.
func TestLimitTCPKeepsTheReserve(t *testing.T) {
	const limit = 1024
	var open atomic.Int64
	// Counted with the new connection open: limit-64 is the last kept.
	open.Store(limit - 64)
	addr, held := serveLimited(t, TCPLimits{}, func() (int, uint64, error) { return int(open.Load()), limit, nil })
	if dial(t, addr, held) == nil {
		t.Fatalf("refused with %d of %d descriptors open", open.Load(), limit)
	}
	open.Add(1)
	if dial(t, addr, held) != nil {
		t.Fatalf("kept with %d of %d descriptors open, inside the reserve of 64", open.Load(), limit)
	}
	open.Add(-1)
	if dial(t, addr, held) == nil {
		t.Fatalf("refused with %d of %d descriptors open", open.Load(), limit)
	}
}
