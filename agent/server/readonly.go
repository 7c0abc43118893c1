package server

import (
	"context"
	"log"
	"net/http"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/httpjson"
	"github.com/gpulet/gpulet/internal/ratelog"
	"github.com/gpulet/gpulet/snapshot"
)

// readOnly serves what pollers read over TCP (--listen): the snapshot (with
// its ETag and long poll), the GPUs and the metrics. Nothing else is there:
// callers over TCP have no identity the daemon can trust, so leasing and
// every admin route stay on the Unix socket.
type readOnly struct {
	routes *httpjson.Mux
	// full serves the snapshot as the Unix socket does (--listen-full-detail);
	// otherwise its redacted form, without uids or reservation names.
	full bool
}

// redactKey marks a request whose snapshot is served redacted.
type redactKey struct{}

// forReader is p as r's reader may see it: redacted when readOnly said so.
func forReader(r *http.Request, p *snapshot.Published) *snapshot.Published {
	if redact, _ := r.Context().Value(redactKey{}).(bool); redact {
		return p.Redacted()
	}
	return p
}

func (ro *readOnly) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !ro.full {
		r = r.WithContext(context.WithValue(r.Context(), redactKey{}, true))
	}
	ro.routes.ServeHTTP(w, r)
}

// ReadOnlyHTTPServer returns an http.Server for the read-only endpoints, for
// a TCP listener; full serves the snapshot with its uids and reservation
// names, else it is redacted. A long poll may wait up to a minute, so writes
// have no deadline; reads of a request's head have.
func (s *Server) ReadOnlyHTTPServer(full bool) *http.Server {
	// Over TCP a path matches only as written, and HEAD is GET without
	// the body. The handlers get Nobody: there is no identity to trust, and
	// the zero Peer would be root.
	ro := &readOnly{full: full, routes: httpjson.NewMux(httpjson.MuxOptions{HEAD: true, NotFound: func(path string) error {
		return api.Errorf(api.ErrNotFound, "no such endpoint here: %s (over TCP gpuletd serves only GET /v1/snapshot, /v1/gpus and /metrics; the rest is on its Unix socket)", path)
	}})}
	route := func(pattern string, h handlerFunc) {
		ro.routes.Handle(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := h(w, r, identity.Nobody); err != nil {
				s.writeError(w, err)
			}
		}))
	}
	route("GET /v1/snapshot", s.snapshot)
	route("GET /v1/gpus", s.gpus)
	route("GET /metrics", s.metrics)
	return &http.Server{
		ConnState:         s.unstarted.track,
		Handler:           ro,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          log.New(budgetWriter{ratelog.New(s.log, "read-only http server errors", httpErrorsPerSecond, nil)}, "", 0),
	}
}
