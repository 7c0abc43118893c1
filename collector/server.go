package collector

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/httpjson"
	"github.com/gpulet/gpulet/internal/ratelog"
	"github.com/gpulet/gpulet/placement"
)

// Server is the collector's HTTP API: one route table, one error mapping.
type Server struct {
	store *Store
	log   *slog.Logger
	// routes is the route table.
	routes  *httpjson.Mux
	metrics http.Handler

	applied, dropped, rejected, busy atomic.Uint64
	// Auth is who may push and read; set it before serving.
	Auth Auth
	// MaxTableRows bounds the rows of one answer of GET /v1/table; the
	// rest is had by paging (offset). Zero: DefaultMaxTableRows.
	MaxTableRows int
	// fileErrors logs, within a budget, the token files that cannot be
	// read again: every request reads them.
	fileErrors *ratelog.Limiter
	// placer answers POST /v1/placements and GET /v1/placements/mix.
	placer *placer
	// pushSlots holds a token for each snapshot body being read: its
	// capacity (--max-pushes-in-flight) times MaxSnapshotBody bounds the
	// memory bodies take, however many senders push at once. pushWait is
	// how long a push waits for a token before it is refused.
	pushSlots chan struct{}
	pushWait  time.Duration
	// pushBodyTime is how long a push that took a slot may take to send
	// its body.
	pushBodyTime time.Duration
}

// DefaultMaxPushesInFlight is --max-pushes-in-flight's default: at most
// 64 MiB of bodies. A node's push (a few KB) is read in well under a
// millisecond on a LAN, so 100,000 nodes pushing every 5 s (20,000 a
// second) keep fewer than 20 slots busy; only slow or stalled senders hold
// a slot long.
const DefaultMaxPushesInFlight = 64

// pushSlotWait is how long a push past --max-pushes-in-flight waits for a
// slot: long enough to ride out a burst of pushes, short enough that
// senders stalled on every slot cannot queue the others for long (gpuletd
// backs off and pushes again).
const pushSlotWait = 250 * time.Millisecond

// pushBodyTime bounds how long a push holds its slot while its body comes:
// a node's few KB take milliseconds, and a sender that dribbles its body to
// keep a slot loses it well before the server's 30 s read timeout.
const pushBodyTime = 5 * time.Second

// NewServer serves store's API.
func NewServer(store *Store, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{store: store, log: log, fileErrors: ratelog.New(log, "token file errors", 1, nil), placer: newPlacer(placement.BestFit)}
	s.SetMaxPushesInFlight(DefaultMaxPushesInFlight)
	s.metrics = s.metricsHandler()
	// A path matches only as written, and HEAD is no route's method.
	s.routes = httpjson.NewMux(httpjson.MuxOptions{})
	route := func(pattern string, h func(w http.ResponseWriter, r *http.Request) error) {
		s.routes.Handle(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := h(w, r); err != nil {
				s.writeError(w, err)
			}
		}))
	}
	route("GET /metrics", s.serveMetrics)
	route("GET /v1/nodes", s.nodes)
	route("POST /v1/placements", s.placements)
	route("GET /v1/placements/mix", s.placementMix)
	route("POST /v1/snapshots", s.snapshot)
	route("GET /v1/table", s.table)
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.routes.ServeHTTP(w, r) }

// SetPolicy sets the placement policy of POST /v1/placements (best-fit
// when never set); call it before serving.
func (s *Server) SetPolicy(p placement.Policy) { s.placer = newPlacer(p) }

// SetMaxPushesInFlight bounds the snapshot bodies read at once
// (--max-pushes-in-flight; at least 1); call it before serving.
func (s *Server) SetMaxPushesInFlight(n int) {
	s.pushSlots, s.pushWait, s.pushBodyTime = make(chan struct{}, max(n, 1)), pushSlotWait, pushBodyTime
}

// takePushSlot takes a place among the bodies read at once, waiting at
// most pushWait and no longer than the request; false: none came free.
func (s *Server) takePushSlot(ctx context.Context) bool {
	select {
	case s.pushSlots <- struct{}{}:
		return true
	default:
	}
	wait := time.NewTimer(s.pushWait)
	defer wait.Stop()
	select {
	case s.pushSlots <- struct{}{}:
		return true
	case <-wait.C:
	case <-ctx.Done():
	}
	return false
}

func (s *Server) releasePushSlot() { <-s.pushSlots }

// bodies recycles the buffers snapshot bodies are read into: at 10,000
// snapshots a second they would otherwise be most of the garbage.
var bodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) error {
	auth, names := r.Header.Get("Authorization"), certNames(r)
	if _, ok := bearer(auth); s.Auth.pushGuarded() && !ok && names == nil {
		// Refused before the body is read; the token itself is checked
		// against the node the body names.
		s.rejected.Add(1)
		return api.Errorf(api.ErrForbidden, "snapshot: the collector wants Authorization: Bearer and the node's token (gpuletd --upstream-token-file), or a client certificate")
	}
	if r.ContentLength > MaxSnapshotBody {
		s.rejected.Add(1)
		return api.Errorf(api.ErrRequestTooLarge, "snapshot body: larger than %d bytes", MaxSnapshotBody)
	}
	// Held until the body's buffer is let go, so that at most
	// cap(pushSlots) bodies take memory at once.
	if !s.takePushSlot(r.Context()) {
		s.busy.Add(1)
		w.Header().Set("Retry-After", "1")
		return api.Errorf(api.ErrUnavailable, "snapshot: the collector is reading as many snapshots as it may at once (--max-pushes-in-flight %d); push again shortly", cap(s.pushSlots))
	}
	defer s.releasePushSlot()
	// Where the connection cannot take a deadline (a test's recorder), the
	// server's read timeout still bounds the body.
	http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.pushBodyTime))
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
	if err := s.checkPush(auth, names, snap.Node); err != nil {
		s.rejected.Add(1)
		return err
	}
	outcome := "applied"
	switch s.store.Apply(snap) {
	case Applied:
		s.applied.Add(1)
	case Repeated:
		// Counted with the dropped, as before: not applied.
		s.dropped.Add(1)
		outcome = "repeated"
	case Dropped:
		s.dropped.Add(1)
		outcome = api.SnapshotDropped
	case Full:
		s.rejected.Add(1)
		return api.Errorf(api.ErrUnavailable, "the table is full (--max-nodes %d, --max-bytes %d): node %q is not taken", s.store.MaxNodes, s.store.MaxBytes, snap.Node)
	}
	// The status stays 204 for every outcome (docs/design.md §13); a sender
	// learns from the header that its snapshot was older than the node's
	// rows, which its own pushes never are.
	w.Header().Set(api.SnapshotOutcomeHeader, outcome)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) nodes(w http.ResponseWriter, r *http.Request) error {
	if err := s.checkRead(r.Header.Get("Authorization")); err != nil {
		return err
	}
	if len(r.URL.Query()) > 0 {
		return api.Errorf(api.ErrBadRequest, "/v1/nodes takes no query parameters")
	}
	return writeJSON(w, http.StatusOK, s.store.Nodes())
}

func (s *Server) table(w http.ResponseWriter, r *http.Request) error {
	if err := s.checkRead(r.Header.Get("Authorization")); err != nil {
		return err
	}
	q, err := ParseQuery(r.URL.Query())
	if err != nil {
		return err
	}
	maxRows := s.MaxTableRows
	if maxRows <= 0 {
		maxRows = DefaultMaxTableRows
	}
	if q.Limit == 0 || q.Limit > maxRows {
		q.Limit = maxRows
	}
	return writeJSON(w, http.StatusOK, s.store.Table(q))
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) error {
	if err := s.checkRead(r.Header.Get("Authorization")); err != nil {
		return err
	}
	s.metrics.ServeHTTP(w, r)
	return nil
}

// writeError is the one place errors become status and body.
func (s *Server) writeError(w http.ResponseWriter, err error) {
	httpjson.Error(w, err, func(err error) { s.log.Error("internal error answering a request", "err", err) })
}

func writeJSON(w http.ResponseWriter, status int, v any) error { return httpjson.Write(w, status, v) }
