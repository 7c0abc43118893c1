// Package testutil holds what tests of every package share: waiting for a
// condition or for a goroutine to block, a buffer safe for concurrent
// writers, a Unix-socket HTTP transport, the raw HTTP/1.1 client that
// benchmarks load servers with, a CA for TLS tests, and the check of a
// router's answers. Only tests import it.
package testutil

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// SyncBuffer is a bytes.Buffer safe for a process's output and a reader.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// UnixTransport dials sock for every request.
func UnixTransport(sock string) *http.Transport {
	return &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}
}

// Eventually polls cond until it holds or 10 seconds pass.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Parked reports whether a goroutine with every one of fns on its stack (a
// substring of a frame, "procwatch.(*Process).Wait") is parked: blocked on a
// channel, a lock, a timer or the network poller, that is, waiting for
// something from outside it. A test that must act only once another
// goroutine waits polls it with Eventually: no sleep can tell that the
// goroutine got there.
func Parked(fns ...string) bool {
	buf := make([]byte, 64<<10)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		header, frames, _ := strings.Cut(g, "\n")
		// "goroutine 7 [IO wait, 2 minutes]:"
		_, state, _ := strings.Cut(header, "[")
		state, _, _ = strings.Cut(state, "]")
		state, _, _ = strings.Cut(state, ",")
		switch state {
		case "running", "runnable", "syscall":
			continue
		}
		if allIn(frames, fns) {
			return true
		}
	}
	return false
}

func allIn(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
