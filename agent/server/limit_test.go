package server

import (
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/internal/connlimit"
	"github.com/gpulet/gpulet/internal/ratelog"
	"github.com/gpulet/gpulet/internal/testutil"
)

// dialEnv makes the test binary a client that connects to the socket it
// names, says one byte and waits for the connection to close.
const dialEnv = "GPULET_SERVER_TEST_DIAL"

func TestMain(m *testing.M) {
	if sock := os.Getenv(dialEnv); sock != "" {
		c, err := net.Dial("unix", sock)
		if err != nil {
			os.Exit(1)
		}
		c.Write([]byte{'x'})
		io.Copy(io.Discard, c)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testListener listens on a fresh socket and wraps it like the daemon does,
// with the peer's uid and the descriptor usage given by the test.
func testListener(t *testing.T, perUID int, uid func() uint32, usage func() (int, uint64, error)) (*limitListener, string, *testutil.SyncBuffer) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	logBuf := &testutil.SyncBuffer{}
	l := LimitListener(ln, perUID, slog.New(slog.NewTextHandler(logBuf, nil))).(*limitListener)
	// No budget: the test reads every refusal line.
	l.refused = ratelog.New(slog.New(slog.NewTextHandler(logBuf, nil)), "refused connections", 1<<20, nil)
	if uid != nil {
		l.credOf = func(c *net.UnixConn) (*unix.Ucred, error) {
			cred, err := l.readCred(c)
			if err == nil {
				cred.Uid = uid()
			}
			return cred, err
		}
	}
	if usage != nil {
		l.gauge.Usage = usage
	}
	// Count at every accept unless a test says otherwise.
	l.gauge.CountEvery, l.gauge.CountNear = 0, 0
	return l, sock, logBuf
}

// closedByServer reports whether the server closed c without a word.
func closedByServer(t *testing.T, c net.Conn) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	return err == io.EOF
}

func TestLimitListenerCapsConnectionsPerUID(t *testing.T) {
	var uid atomic.Uint32
	uid.Store(1000)
	l, sock, logBuf := testListener(t, 2, uid.Load, nil)
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	take := func() net.Conn {
		t.Helper()
		select {
		case c := <-accepted:
			return c
		case <-time.After(5 * time.Second):
			t.Fatal("connection not accepted")
			return nil
		}
	}
	dial()
	a := take()
	dial()
	take()
	third := dial()
	if !closedByServer(t, third) {
		t.Fatal("a third connection of uid 1000 was not closed")
	}
	if !strings.Contains(logBuf.String(), "--max-conns-per-uid") || !strings.Contains(logBuf.String(), "uid=1000") {
		t.Fatalf("refusal not logged:\n%s", logBuf)
	}
	// Another user still gets in, and so does root, uncapped.
	uid.Store(2000)
	dial()
	take()
	uid.Store(0)
	for range 3 {
		dial()
		take()
	}
	if l.open(0) != 0 {
		t.Fatal("root's connections were counted")
	}
	// Closing one gives uid 1000 its place back, once however often it is closed.
	uid.Store(1000)
	a.Close()
	a.Close()
	if n := l.open(1000); n != 1 {
		t.Fatalf("uid 1000 holds %d after a close, want 1", n)
	}
	dial()
	take()
	if n := l.open(1000); n != 2 {
		t.Fatalf("uid 1000 holds %d, want 2", n)
	}
}

func TestLimitListenerKeepsADescriptorReserve(t *testing.T) {
	var open atomic.Int64
	const limit = 1024
	l, sock, logBuf := testListener(t, 0, nil, func() (int, uint64, error) { return int(open.Load()), limit, nil })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			// Answer, so that the client can tell an accepted connection.
			c.Write([]byte{'y'})
		}
	}()
	try := func() bool {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _ := c.Read(make([]byte, 1))
		return n == 1
	}
	open.Store(limit - fdReserve)
	if !try() {
		t.Fatalf("refused with exactly the reserve free:\n%s", logBuf)
	}
	open.Store(limit - fdReserve + 1)
	if try() {
		t.Fatal("accepted with less than the reserve free")
	}
	if !strings.Contains(logBuf.String(), "near the limit") {
		t.Fatalf("refusal not logged:\n%s", logBuf)
	}
	open.Store(limit - fdReserve - 10)
	if !try() {
		t.Fatal("refused after descriptors were freed")
	}
}

func TestReserveIsAQuarterOfASmallLimit(t *testing.T) {
	// With a limit of 64 the reserve is 16, so that connections still fit.
	var open int
	l, _, _ := testListener(t, 0, nil, func() (int, uint64, error) { return open, 64, nil })
	open = 48
	if !l.fdsLeft() {
		t.Fatal("refused with 16 of 64 free")
	}
	open = 49
	if l.fdsLeft() {
		t.Fatal("accepted with 15 of 64 free")
	}
}

func TestFdUsageCountsOpenDescriptors(t *testing.T) {
	before, limit, err := connlimit.FDUsage()
	if err != nil {
		t.Fatal(err)
	}
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	if limit != lim.Cur {
		t.Fatalf("limit %d, want %d", limit, lim.Cur)
	}
	var files []*os.File
	for range 40 {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	after, _, err := connlimit.FDUsage()
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	if after-before != 40 {
		t.Fatalf("open descriptors went from %d to %d with 40 more files, want +40", before, after)
	}
}

func TestParseGroups(t *testing.T) {
	le := func(gids ...uint32) []byte {
		var b []byte
		for _, g := range gids {
			b = binary.NativeEndian.AppendUint32(b, g)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		in   []byte
		want []uint32
		ok   bool
	}{
		{"none", nil, []uint32{}, true},
		{"root and others", le(0, 4, 1000), []uint32{0, 4, 1000}, true},
		{"largest gid", le(4294967295), []uint32{4294967295}, true},
		{"ragged", []byte{1, 0, 0}, nil, false},
		{"too many", make([]byte, 4*(maxGroups+1)), nil, false},
	} {
		got, err := parseGroups(tc.in)
		if (err == nil) != tc.ok || (tc.ok && !slices.Equal(got, tc.want)) {
			t.Errorf("%s: parseGroups = %v, %v; want %v, ok %v", tc.name, got, err, tc.want, tc.ok)
		}
	}
}

func FuzzParseGroups(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0, 232, 3, 0, 0})
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		gids, err := parseGroups(b)
		if err == nil && len(gids)*4 != len(b) {
			t.Fatalf("%d gids from %d bytes", len(gids), len(b))
		}
	})
}

// TestGroupsComeFromTheConnection: the groups are those the connecting process
// had (a child started with its own), read from the socket, and an admin
// group among them makes the caller an admin.
func TestGroupsComeFromTheConnection(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to start a process with other groups")
	}
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), dialEnv+"="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{4343, 7}}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Read(make([]byte, 1))
	rc, err := c.(*net.UnixConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	gids, err := peerGroups(rc)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(gids, []uint32{7, 4343}) {
		t.Fatalf("groups %v, want [7 4343]", gids)
	}
	s := New(partsOf(newFakeCore(t)), 4343, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ci := s.connContext(t.Context(), c).Value(connKey{}).(*connInfo)
	if !ci.peer.Admin || !slices.Equal(ci.peer.Groups, gids) || ci.peer.PID != cmd.Process.Pid {
		t.Fatalf("peer %+v, want admin by group 4343, pid %d", ci.peer, cmd.Process.Pid)
	}
}

// TestLimitListenerEstimatesBetweenCounts: between two counts of the open
// descriptors, the connections accepted and closed move the estimate, so that
// a flood of connections is refused without a count per accept.
func TestLimitListenerEstimatesBetweenCounts(t *testing.T) {
	var counts atomic.Int64
	const limit, atCount = 1000, 900
	l, sock, _ := testListener(t, 0, nil, func() (int, uint64, error) { counts.Add(1); return atCount, limit, nil })
	l.gauge.CountEvery, l.gauge.CountNear = time.Hour, time.Hour
	accepted := make(chan net.Conn, 100)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	var kept []net.Conn
	refused := 0
	for range 40 {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		select {
		case a := <-accepted:
			kept = append(kept, a)
		case <-time.After(200 * time.Millisecond):
			if !closedByServer(t, c) {
				t.Fatal("a connection was neither accepted nor closed")
			}
			refused++
		}
	}
	// 900 open with the first connection; each more adds one, up to 1000
	// less the reserve of 64.
	if len(kept) != 37 || refused != 3 || counts.Load() != 1 {
		t.Fatalf("kept %d, refused %d, with %d counts; want 37, 3 and 1", len(kept), refused, counts.Load())
	}
	for _, c := range kept[:5] {
		c.Close()
	}
	for range 5 {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		select {
		case <-accepted:
		case <-time.After(5 * time.Second):
			t.Fatal("not accepted after 5 connections closed")
		}
	}
}
