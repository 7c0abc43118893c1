package client_test

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/gpulet/gpulet/client"
)

// SnapshotIfChanged sends the ETag it is given and tells a 304 (nothing new)
// from a snapshot.
func TestSnapshotIfChanged(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "gpulet.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	const tag, body = `"boot-7"`, `{"seq":7}` + "\n"
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", tag)
		if r.Header.Get("If-None-Match") == tag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Write([]byte(body))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	c := &client.Client{Socket: sock, MaxConns: 1}
	ctx := context.Background()
	for _, tc := range []struct {
		name, etag, wantRaw string
	}{
		{"no tag", "", body},
		{"a stale tag", `"boot-6"`, body},
		{"the current tag", tag, ""},
	} {
		raw, got, err := c.SnapshotIfChanged(ctx, tc.etag)
		if err != nil || string(raw) != tc.wantRaw || got != tag || (tc.wantRaw == "") != (raw == nil) {
			t.Errorf("%s: %q, %q, %v; want %q and tag %q", tc.name, raw, got, err, tc.wantRaw, tag)
		}
	}
}
