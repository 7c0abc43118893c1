package collector

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gpulet/gpulet/api"
)

// Server is the collector's HTTP API: one route table, one error mapping.
type Server struct {
	store   *Store
	log     *slog.Logger
	routes  []route
	metrics http.Handler

	applied, dropped, rejected atomic.Uint64
	// Token, when set, is the bearer token a snapshot must come with.
	Token string
}

type route struct {
	method, path string
	handle       func(w http.ResponseWriter, r *http.Request) error
}

// NewServer serves store's API.
func NewServer(store *Store, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{store: store, log: log}
	s.metrics = s.metricsHandler()
	s.routes = []route{
		{"GET", "/metrics", s.serveMetrics},
		{"GET", "/v1/nodes", s.nodes},
		{"POST", "/v1/snapshots", s.snapshot},
		{"GET", "/v1/table", s.table},
	}
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var allowed []string
	for _, rt := range s.routes {
		if rt.path != r.URL.Path {
			continue
		}
		if rt.method != r.Method {
			allowed = append(allowed, rt.method)
			continue
		}
		if err := rt.handle(w, r); err != nil {
			s.writeError(w, err)
		}
		return
	}
	if len(allowed) > 0 {
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		s.writeError(w, api.Errorf(api.ErrMethodNotAllowed, "%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allowed, ", ")))
		return
	}
	s.writeError(w, api.Errorf(api.ErrNotFound, "no such endpoint: %s", r.URL.Path))
}

// bodies recycles the buffers snapshot bodies are read into: at 10,000
// snapshots a second they would otherwise be most of the garbage.
var bodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) error {
	if s.Token != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+s.Token)) != 1 {
		s.rejected.Add(1)
		return api.Errorf(api.ErrForbidden, "snapshot: the collector wants Authorization: Bearer and the token of its --token-file (gpuletd --upstream-token-file)")
	}
	if r.ContentLength > MaxSnapshotBody {
		s.rejected.Add(1)
		return api.Errorf(api.ErrRequestTooLarge, "snapshot body: larger than %d bytes", MaxSnapshotBody)
	}
	buf := bodies.Get().(*bytes.Buffer)
	defer func() {
		// A rare huge body is not kept for everyone.
		if buf.Cap() <= 64<<10 {
			buf.Reset()
			bodies.Put(buf)
		}
	}()
	buf.Reset()
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, MaxSnapshotBody)); err != nil {
		s.rejected.Add(1)
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return api.Errorf(api.ErrRequestTooLarge, "snapshot body: larger than %d bytes", MaxSnapshotBody)
		}
		return api.Errorf(api.ErrBadRequest, "snapshot body: %v", err)
	}
	snap, err := DecodeSnapshot(buf.Bytes())
	if err != nil {
		s.rejected.Add(1)
		return err
	}
	switch s.store.Apply(snap) {
	case Applied:
		s.applied.Add(1)
	case Dropped:
		s.dropped.Add(1)
	case Full:
		s.rejected.Add(1)
		return api.Errorf(api.ErrUnavailable, "the table holds its most nodes (--max-nodes %d): node %q is not taken", s.store.MaxNodes, snap.Node)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) nodes(w http.ResponseWriter, r *http.Request) error {
	if len(r.URL.Query()) > 0 {
		return api.Errorf(api.ErrBadRequest, "/v1/nodes takes no query parameters")
	}
	return writeJSON(w, http.StatusOK, s.store.Nodes())
}

func (s *Server) table(w http.ResponseWriter, r *http.Request) error {
	q, err := ParseQuery(r.URL.Query())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, s.store.Table(q))
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) error {
	s.metrics.ServeHTTP(w, r)
	return nil
}

// writeError is the one place errors become status and body.
func (s *Server) writeError(w http.ResponseWriter, err error) {
	status, code := api.StatusOf(err)
	if status == http.StatusInternalServerError {
		s.log.Error("internal error answering a request", "err", err)
	}
	writeJSON(w, status, api.ErrorBody{Error: api.ErrorDetail{Code: code, Message: err.Error()}})
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
	io.WriteString(w, "\n")
	return nil
}
