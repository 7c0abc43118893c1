package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"testing"

	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
)

// benchCore grants and releases one lease, and records nothing, so that a
// benchmark measures the server around it.
type benchCore struct {
	*fakeCore
	grant lease.Grant
}

func (c benchCore) Acquire(context.Context, identity.Peer, lease.Request) (lease.Grant, error) {
	return c.grant, nil
}
func (c benchCore) Release(identity.Peer, string) error { return nil }

// discardWriter is a ResponseWriter that keeps its header map and status,
// and no body.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(status int)      { w.status = status }

// BenchmarkServeLease is the server's own work for the two requests of a
// lease and its release, from a request as net/http hands it over to the
// answer written: identity, body, routing, decoding, encoding. The core
// answers at once, and no connection is involved.
func BenchmarkServeLease(b *testing.B) {
	l := api.Lease{ID: "l-0123456789abcdef", Units: []int{0}}
	js, err := json.Marshal(l)
	if err != nil {
		b.Fatal(err)
	}
	s := New(partsOf(benchCore{fakeCore: newFakeCore(nil), grant: lease.Grant{Lease: l, JSON: js}}), -1, slog.New(slog.DiscardHandler))
	ctx := context.WithValue(context.Background(), connKey{}, &connInfo{peer: identity.Peer{UID: 1000, GID: 1000, PID: 1}})
	body := []byte(`{"units":1,"ttl":"1m"}`)
	for _, tc := range []struct {
		name, method, target string
		body                 []byte
		status               int
	}{
		{"lease", "POST", "/v1/leases", body, http.StatusCreated},
		{"release", "DELETE", "/v1/leases/" + l.ID, nil, http.StatusNoContent},
	} {
		b.Run(tc.name, func(b *testing.B) {
			u, err := url.ParseRequestURI(tc.target)
			if err != nil {
				b.Fatal(err)
			}
			w := &discardWriter{h: http.Header{}}
			var rd bytes.Reader
			b.ReportAllocs()
			for b.Loop() {
				rd.Reset(tc.body)
				r := &http.Request{Method: tc.method, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{},
					Body: io.NopCloser(&rd), ContentLength: int64(len(tc.body)), Host: "gpulet", RequestURI: tc.target}
				if tc.body == nil {
					r.Body = http.NoBody
				}
				clear(w.h)
				s.ServeHTTP(w, r.WithContext(ctx))
			}
			if w.status != tc.status {
				b.Fatalf("%s %s: status %d, want %d", tc.method, tc.target, w.status, tc.status)
			}
		})
	}
}
