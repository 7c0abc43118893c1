package test

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// freePort is a loopback TCP port nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skip("no loopback TCP here:", err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// anyPort is what gpuletd is given for --listen: a free port the kernel
// picks at its bind, read back by listenAddr. A port picked before gpuletd
// starts (freePort) may be taken meanwhile by any test of the packages that
// run beside this one.
const anyPort = "127.0.0.1:0"

// listenAddr is the address gpuletd serves --listen on, from its log.
func listenAddr(t *testing.T, d *e2e.Daemon) string {
	t.Helper()
	re := regexp.MustCompile(`msg="serving the read-only endpoints over TCP" listen=(\S+)`)
	var addr string
	testutil.Eventually(t, "gpuletd's --listen address in its log", func() bool {
		if m := re.FindStringSubmatch(d.Log.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	return addr
}

// TestListenServesPollersOverTCP: with --listen, pollers read the snapshot,
// the GPUs and the metrics over TCP, and a long poll there answers as soon as
// a lease taken on the Unix socket changes the node; leasing is not there.
func TestListenServesPollersOverTCP(t *testing.T) {
	d := e2e.Start(t, "--listen", anyPort)
	addr := listenAddr(t, d)
	base := "http://" + addr
	get := func(path string) (int, []byte, http.Header) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b, resp.Header
	}
	status, body, h := get("/v1/snapshot")
	var s api.Snapshot
	if status != 200 || json.Unmarshal(body, &s) != nil || h.Get("ETag") != fmt.Sprintf(`"%s-%d"`, s.BootID, s.Seq) {
		t.Fatalf("GET /v1/snapshot over TCP: %d, ETag %q, %s", status, h.Get("ETag"), body)
	}
	if status, body, _ := get("/metrics"); status != 200 || !strings.Contains(string(body), "gpulet_") {
		t.Fatalf("GET /metrics over TCP: %d", status)
	}
	resp, err := http.Post(base+"/v1/leases", "application/json", strings.NewReader(`{"units":1,"ttl":"1m"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("POST /v1/leases over TCP: %d, want 404", resp.StatusCode)
	}
	polled := longPoll(t, addr, fmt.Sprintf("/v1/snapshot?after=%s-%d&wait=30s", s.BootID, s.Seq))
	if _, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"}); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-polled:
		if a.err != nil || a.status != 200 || a.seq <= s.Seq {
			t.Fatalf("long poll: %d %v, seq %d after %d", a.status, a.err, a.seq, s.Seq)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the long poll did not answer the lease's change")
	}
	// A long poll still waiting does not hold up the stop.
	_, body, _ = get("/v1/snapshot")
	json.Unmarshal(body, &s)
	longPoll(t, addr, fmt.Sprintf("/v1/snapshot?after=%s-%d&wait=60s", s.BootID, s.Seq))
	if err := d.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if strings.Contains(d.Log.String(), "error while stopping") {
		t.Fatalf("the stop waited on the long poll:\n%s", d.Log.String())
	}
}

// pollAnswer is what a long poll got: its status and the snapshot's seq.
type pollAnswer struct {
	status int
	seq    uint64
	err    error
}

// longPoll sends GET path to addr on a connection of its own and returns
// once gpuletd has read the request, so that what the test does next
// happens while the poll waits; the answer comes on the channel.
func longPoll(t *testing.T, addr, path string) <-chan pollAnswer {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: gpulet\r\n\r\n", path); err != nil {
		t.Fatal(err)
	}
	// Acknowledged bytes sit in gpuletd's receive queue until it reads them.
	testutil.Eventually(t, "gpuletd to read the long poll", func() bool {
		unacked, _, ok := tcpQueues(t, c.LocalAddr(), c.RemoteAddr())
		_, unread, served := tcpQueues(t, c.RemoteAddr(), c.LocalAddr())
		return ok && served && unacked == 0 && unread == 0
	})
	answered := make(chan pollAnswer, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			answered <- pollAnswer{err: err}
			return
		}
		defer resp.Body.Close()
		var s api.Snapshot
		err = json.NewDecoder(resp.Body).Decode(&s)
		answered <- pollAnswer{resp.StatusCode, s.Seq, err}
	}()
	return answered
}

// tcpQueues returns the bytes sent and not acknowledged, and those received
// and not read, of the IPv4 TCP socket from local to remote, as
// /proc/net/tcp shows them; ok is false when there is no such socket.
func tcpQueues(t *testing.T, local, remote net.Addr) (unacked, unread uint64, ok bool) {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	from, to := procNetAddr(local), procNetAddr(remote)
	for _, line := range strings.Split(string(b), "\n") {
		// sl local_address rem_address st tx_queue:rx_queue ...
		f := strings.Fields(line)
		if len(f) < 5 || f[1] != from || f[2] != to {
			continue
		}
		tx, rx, _ := strings.Cut(f[4], ":")
		unacked, err1 := strconv.ParseUint(tx, 16, 64)
		unread, err2 := strconv.ParseUint(rx, 16, 64)
		return unacked, unread, err1 == nil && err2 == nil
	}
	return 0, 0, false
}

// procNetAddr is an IPv4 TCP address as /proc/net/tcp writes it: the
// address's four bytes as one native-endian word, and the port, in hex.
func procNetAddr(a net.Addr) string {
	ta := a.(*net.TCPAddr)
	return fmt.Sprintf("%08X:%04X", binary.NativeEndian.Uint32(ta.IP.To4()), ta.Port)
}

// TestTCPFloodKeepsTheUnixSocketServed: with gpuletd's open-file limit cut
// to 1,024 and --listen's connection caps raised past it, 1,500 TCP long
// polls once took every descriptor, and leases on the Unix socket (a user's
// and root's) failed with "accept4: too many open files". Now --listen stops
// at its own reserve, twice the Unix socket's, and local callers still lease.
func TestTCPFloodKeepsTheUnixSocketServed(t *testing.T) {
	needUserTools(t)
	sock := addGroup(t)
	user := addUser(t, sock)
	d := startForUsers(t, sock, "--listen", anyPort, "--listen-max-conns", "5000", "--listen-max-conns-per-addr", "5000")
	addr := listenAddr(t, d)
	const limit, flood = 1024, 1500
	if err := unix.Prlimit(d.Pid(), unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}, nil); err != nil {
		t.Fatal(err)
	}
	snap, err := d.Client.Snapshot(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	poll := fmt.Sprintf("GET /v1/snapshot?after=%s-%d&wait=60s HTTP/1.1\r\nHost: x\r\n\r\n", snap.BootID, snap.Seq)
	conns := make(chan net.Conn, flood)
	t.Cleanup(func() {
		close(conns)
		for c := range conns {
			c.Close()
		}
	})
	var wg sync.WaitGroup
	for w := range 20 {
		wg.Go(func() {
			for i := w; i < flood; i += 20 {
				c, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					continue
				}
				c.Write([]byte(poll))
				conns <- c
			}
		})
	}
	wg.Wait()
	// gpuletd accepts TCP connections at a bounded pace: the rest wait in
	// the kernel's backlog until it has taken as many as its reserve allows.
	testutil.Eventually(t, "gpuletd refusing TCP connections at its descriptor reserve", func() bool {
		return strings.Contains(d.Log.String(), "TCP connection refused: open file descriptors are near the limit")
	})
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d TCP long polls opened; gpuletd holds %d descriptors of %d", len(conns), len(fds), limit)
	if len(fds) > limit-fdReserveOfUnix {
		t.Fatalf("gpuletd holds %d descriptors of %d under a TCP flood: the Unix socket's reserve of %d is gone", len(fds), limit, fdReserveOfUnix)
	}
	if got := request(t, d, user, "POST", "/v1/leases", `{"units":1,"ttl":"1m"}`); got != "201" {
		t.Fatalf("a user's lease under the TCP flood: %s", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := d.Client.Lease(ctx, api.LeaseRequest{Units: 1, TTL: "1m"}); err != nil {
		t.Fatalf("root's lease under the TCP flood: %v", err)
	}
	if log := d.Log.String(); strings.Contains(log, "too many open files") {
		t.Fatalf("descriptors ran out:\n%.3000s", log)
	}
}

// fdReserveOfUnix is the descriptors gpuletd keeps for its Unix socket and
// its own work whatever TCP peers hold (agent/server's reserve).
const fdReserveOfUnix = 64
