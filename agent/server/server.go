// Package server is gpulet's HTTP API on the Unix socket, and its read-only
// face over TCP: one route table, one ServeHTTP that does what every route
// needs (identity, body limit), the wire codec of requests, and one function
// mapping errors to status and body. It owns the wire and who is calling,
// never a decision: handlers call small interfaces (Parts), so that a
// map-backed fake tests them, and the agent and the lease engine can change
// behind them without the wire moving.
package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/agent/metrics"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/httpjson"
	"github.com/gpulet/gpulet/internal/ratelog"
	"github.com/gpulet/gpulet/snapshot"
)

// handlerFunc is a route's handler: it answers, or returns the error that
// writeError turns into the answer.
type handlerFunc func(w http.ResponseWriter, r *http.Request, peer identity.Peer) error

// Server serves the API.
type Server struct {
	core   Core
	leases Leases
	slurm  SlurmJobs
	res    Reservations
	snaps  Snapshots
	// sim is the simulated backend's control; nil on real GPUs.
	sim func(index int, u api.SimGPUUpdate) error
	// routes is the route table, for the requests ServeHTTP passes on.
	routes *httpjson.Mux
	log    *slog.Logger
	// internal bounds the lines about internal errors and unreadable
	// credentials, which a caller may be able to cause repeatedly.
	internal *ratelog.Limiter
	// adminGID is the --admin-group's gid; -1 when none.
	adminGID int
	// Live, when set, adds the metrics read at each scrape (process, Go
	// runtime, build, lease latency) to /metrics, and times lease requests.
	Live *metrics.Live
	// PrivateLeases keeps GET /v1/leases?all=true to the caller's own
	// leases for callers who are not admins (--private-leases).
	PrivateLeases bool
	// unstarted are the connections of its servers that have not begun a
	// request, which Shutdown closes.
	unstarted unstarted
}

// internalLinesPerSecond bounds the lines of s.internal.
const internalLinesPerSecond = 10

// New builds the API over p. adminGID is the gid whose members act as
// admins (-1: only root).
func New(p Parts, adminGID int, log *slog.Logger) *Server {
	s := &Server{core: p.Core, leases: p.Leases, slurm: p.SlurmJobs, res: p.Reservations, snaps: p.Snapshots, sim: p.SimGPU,
		log: log, adminGID: adminGID, internal: ratelog.New(log, "internal error lines", internalLinesPerSecond, nil)}
	// On the socket a path matches without its leading and trailing
	// slashes, and HEAD is no route's method.
	s.routes = httpjson.NewMux(httpjson.MuxOptions{TrimSlashes: true})
	route := func(pattern string, h handlerFunc) { s.routes.Handle(pattern, s.withPeer(h)) }
	route("GET /metrics", s.metrics)
	route("GET /v1/gpus", s.gpus)
	route("GET /v1/leases", s.listLeases)
	route("POST /v1/leases", s.createLease)
	route("GET /v1/leases/{id}", s.getLease)
	route("DELETE /v1/leases/{id}", s.releaseLease)
	route("POST /v1/leases/{id}/renew", s.renewLease)
	route("DELETE /v1/slurm/jobs/{job}", s.releaseSlurmJob)
	route("GET /v1/reservations", s.listReservations)
	route("POST /v1/reservations", s.createReservation)
	route("GET /v1/reservations/{name}", s.getReservation)
	route("DELETE /v1/reservations/{name}", s.deleteReservation)
	route("POST /v1/reservations/{name}/advance", s.advanceReservation)
	route("POST /v1/node/drain", s.drain)
	route("POST /v1/node/undrain", s.undrain)
	if p.SimGPU != nil {
		route("POST /v1/sim/gpus/{index}", s.simGPU)
	}
	route("GET /v1/snapshot", s.snapshot)
	route("POST /v1/placements", s.placements)
	route("GET /v1/profiles", s.profiles)
	route("GET /v1/pools", s.pools)
	route("GET /v1/quotas", s.quotas)
	return s
}

// withPeer calls h with the caller's identity, which ServeHTTP checked is
// there, and answers its error.
func (s *Server) withPeer(h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r, r.Context().Value(connKey{}).(*connInfo).peer); err != nil {
			s.writeError(w, err)
		}
	})
}

type connKey struct{}

// connInfo is what a connection carries in its context: who connected, and
// the socket, to ask the kernel for the connected process's pidfd.
type connInfo struct {
	peer identity.Peer
	rc   syscall.RawConn
}

// connContext reads the caller's credentials once per connection:
// SO_PEERCRED (uid, gid, pid; the listener may have read it at accept) and
// SO_PEERGROUPS. Both are what the process had when it connected, so rights
// never come from whatever process has its pid later (nothing about identity
// is read from /proc).
func (s *Server) connContext(ctx context.Context, c net.Conn) context.Context {
	var uc *net.UnixConn
	var cred *unix.Ucred
	switch c := c.(type) {
	case *peerConn:
		uc, cred = c.UnixConn, &c.cred
	case *net.UnixConn:
		uc = c
	default:
		return ctx
	}
	rc, err := uc.SyscallConn()
	if err == nil && cred == nil {
		cred, err = peerCred(rc)
	}
	if err != nil {
		s.internal.Log(slog.LevelWarn, "cannot read a caller's credentials; its requests are refused", "err", err)
		return ctx
	}
	peer := identity.Peer{UID: cred.Uid, GID: cred.Gid, PID: int(cred.Pid)}
	if peer.Groups, err = peerGroups(rc); err != nil {
		// Fail closed: without its groups the caller is admin only by its
		// uid or its primary group.
		s.internal.Log(slog.LevelWarn, "cannot read a caller's groups", "uid", peer.UID, "err", err)
	}
	peer.Admin = peer.UID == 0 || (s.adminGID >= 0 && peer.InGroup(uint32(s.adminGID)))
	return context.WithValue(ctx, connKey{}, &connInfo{peer: peer, rc: rc})
}

// httpErrorsPerSecond bounds the lines of http.Server's own errors (accept
// errors, bad TLS, a handler's panic): a caller can cause them by the
// thousand.
const httpErrorsPerSecond = 5

// HTTPServer returns an http.Server for s with timeouts that keep slow or idle
// clients from holding connections, and its own error lines going through the
// structured log within a budget.
func (s *Server) HTTPServer() *http.Server {
	return &http.Server{
		ConnState:         s.unstarted.track,
		Handler:           s,
		ConnContext:       s.connContext,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          log.New(budgetWriter{ratelog.New(s.log, "http server errors", httpErrorsPerSecond, nil)}, "", 0),
	}
}

// budgetWriter turns the lines of a *log.Logger into structured log lines
// within a budget.
type budgetWriter struct{ l *ratelog.Limiter }

func (w budgetWriter) Write(p []byte) (int, error) {
	w.l.Log(slog.LevelWarn, "http server error", "err", strings.TrimSpace(string(p)))
	return len(p), nil
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, ok := r.Context().Value(connKey{}).(*connInfo); !ok {
		s.writeError(w, api.Errorf(api.ErrForbidden, "caller identity unknown: the API is served only on the Unix socket"))
		return
	}
	if r.ContentLength > MaxRequestBody {
		s.writeError(w, api.Errorf(api.ErrRequestTooLarge, "request body: larger than %d bytes", MaxRequestBody))
		return
	}
	// The body is read whole here, so that the decoders see bytes and a body
	// over the limit is refused in one place.
	body, err := readBody(w, r)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			s.writeError(w, api.Errorf(api.ErrRequestTooLarge, "request body: larger than %d bytes", MaxRequestBody))
		} else {
			s.writeError(w, api.Errorf(api.ErrBadRequest, "request body: %v", err))
		}
		return
	}
	r.Body = wholeBody{bytes.NewReader(body), body}
	s.routes.ServeHTTP(w, r)
}

// readBody reads a request's body whole, at most MaxRequestBody bytes
// of it: into a buffer of its length where the request says it, so that the
// common small body costs one exact allocation, and none where there is no
// body.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if n := r.ContentLength; n > 0 && n <= MaxRequestBody {
		b := make([]byte, n)
		_, err := io.ReadFull(r.Body, b)
		return b, err
	}
	return io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBody))
}

// wholeBody is a request body that ServeHTTP has read whole: handlers may read
// it as a stream, and decoders take its bytes (bodyBytes).
type wholeBody struct {
	*bytes.Reader
	b []byte
}

func (wholeBody) Close() error { return nil }

// bodyBytes is the body of a request that ServeHTTP passed on.
func bodyBytes(r *http.Request) []byte {
	if wb, ok := r.Body.(wholeBody); ok {
		return wb.b
	}
	// Handlers are reached only through ServeHTTP: this is never taken.
	panic("gpulet: request body not read by ServeHTTP")
}

// writeError is the one place errors become status and body.
func (s *Server) writeError(w http.ResponseWriter, err error) {
	httpjson.Error(w, err, func(err error) { s.internal.Log(slog.LevelError, "internal error answering a request", "err", err) })
}

func writeJSON(w http.ResponseWriter, status int, v any) error { return httpjson.Write(w, status, v) }

// writeEncoded answers with b, JSON already encoded, and the newline that
// ends every answer.
func writeEncoded(w http.ResponseWriter, status int, b []byte) { httpjson.WriteEncoded(w, status, b) }

func (s *Server) published() (*snapshot.Published, error) {
	p := s.snaps.Load()
	if p == nil {
		return nil, api.Errorf(api.ErrUnavailable, "gpuletd is starting: no snapshot yet")
	}
	return p, nil
}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request, _ identity.Peer) error {
	p, err := s.published()
	if err != nil {
		return err
	}
	if q := r.URL.Query(); q.Has("after") || q.Has("wait") {
		after, wait, err := parsePoll(q)
		if err != nil {
			return err
		}
		p = s.newer(r.Context(), p, after, wait)
	}
	p = forReader(r, p)
	tag := etag(p.Snapshot)
	w.Header().Set("ETag", tag)
	if noneMatch(r.Header.Get("If-None-Match"), tag) {
		w.WriteHeader(http.StatusNotModified)
		return nil
	}
	w.Header().Set("Content-Type", "application/json")
	// Written before WithJSON returns: net/http copies or sends the bytes
	// within Write.
	p.WithJSON(func(body []byte) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	})
	return nil
}

func (s *Server) gpus(w http.ResponseWriter, r *http.Request, _ identity.Peer) error {
	p, err := s.published()
	if err != nil {
		return err
	}
	p = forReader(r, p)
	return writeJSON(w, http.StatusOK, api.GPUList{Backend: p.Snapshot.Backend, MPS: p.Snapshot.MPS, GPUs: p.Snapshot.GPUs})
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request, _ identity.Peer) error {
	p, err := s.published()
	if err != nil {
		return err
	}
	p = forReader(r, p)
	w.Header().Set("Content-Type", metrics.ContentType)
	w.Write(p.Metrics())
	if s.Live != nil {
		w.Write(s.Live.Render())
	}
	return nil
}

func (s *Server) createLease(w http.ResponseWriter, r *http.Request, peer identity.Peer) (err error) {
	if s.Live != nil {
		start := time.Now()
		defer func() { s.Live.ObserveLease(time.Since(start), err == nil) }()
	}
	req, err := DecodeRequestBytes(bodyBytes(r))
	if err != nil {
		return err
	}
	if req.TTL == 0 && req.PID == 0 {
		// Bound to the caller's own process: exactly the one that connected.
		if peer.PIDFD, err = s.callerPidfd(r.Context(), peer); err != nil {
			return err
		}
		if peer.PIDFD != nil {
			defer peer.PIDFD.Close()
		}
	}
	l, err := s.core.Acquire(r.Context(), peer, req)
	if err != nil {
		return endedWhileWaiting(r, err)
	}
	w.Header().Set("Location", "/v1/leases/"+l.ID)
	writeEncoded(w, http.StatusCreated, l.JSON)
	return nil
}

// callerPidfd is a pidfd for the process that connected, or nil where the
// kernel cannot give one (the lease manager then checks the pid's owner).
// The caller closes it.
func (s *Server) callerPidfd(ctx context.Context, peer identity.Peer) (*os.File, error) {
	f, err := peerPidfd(ctx.Value(connKey{}).(*connInfo).rc)
	switch {
	case err == nil:
		return f, nil
	case errors.Is(err, errNoPeerPidfd), errors.Is(err, unix.ENODATA):
		return nil, nil
	case errors.Is(err, unix.ESRCH), errors.Is(err, unix.EINVAL):
		// Older kernels give no pidfd for a process that has been reaped
		// (EINVAL or ESRCH, by version); newer ones give one, which the
		// lease manager finds dead.
		return nil, api.Errorf(api.ErrBadRequest, "pid: process %d, which connected, is not running", peer.PID)
	}
	return nil, err
}

func (s *Server) getLease(w http.ResponseWriter, r *http.Request, peer identity.Peer) error {
	l, err := s.core.Get(peer, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, l)
}

func (s *Server) renewLease(w http.ResponseWriter, r *http.Request, peer identity.Peer) error {
	l, err := s.leases.Renew(peer, r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, l)
}

func (s *Server) releaseLease(w http.ResponseWriter, r *http.Request, peer identity.Peer) error {
	if err := s.leases.Release(peer, r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
