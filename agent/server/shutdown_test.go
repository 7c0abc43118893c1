package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpulet/gpulet/internal/testutil"
)

// A connection that never sends a request does not hold up a stop: Go's
// Shutdown alone counts it as busy for five seconds.
func TestShutdownClosesSilentConnections(t *testing.T) {
	s := New(partsOf(newFakeCore(t)), -1, slog.New(slog.NewTextHandler(io.Discard, nil)))
	srv := s.HTTPServer()
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	silent, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	testutil.Eventually(t, "the silent connection accepted", func() bool {
		s.unstarted.mu.Lock()
		defer s.unstarted.mu.Unlock()
		return len(s.unstarted.conns) == 1
	})
	// Well under Go's five seconds, well over what closing takes.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx, srv); err != nil {
		t.Fatalf("Shutdown with a silent connection open: %v", err)
	}
	<-served
	silent.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := silent.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the silent connection after the stop: %v, want it closed (EOF)", err)
	}
}
