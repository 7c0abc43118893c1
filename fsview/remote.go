package fsview

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/internal/ratelog"
	"github.com/gpulet/gpulet/snapshot"
)

// Remote is a Source that asks gpuletd over its socket, for a view served by
// a process of its own. Every Load asks for the current snapshot, naming the
// one it holds (If-None-Match with its ETag), so that a read sees every
// change completed before it, as the view in gpuletd's process does, while
// an unchanged node costs gpuletd an answer of a few bytes. The lease list
// and the metrics are asked for only when a file needs them, once per
// snapshot: they are gpuletd's as of that first ask, moments after the
// snapshot's.
type Remote struct {
	c   *client.Client
	log *ratelog.Limiter

	mu   sync.Mutex // guards cur, etag and asked
	cur  *snapshot.Published
	etag string
	// asked is when the request that last gave or confirmed cur was sent:
	// cur is the current snapshot as of then, or newer.
	asked time.Time
}

// remoteTimeout bounds one request to gpuletd: a FUSE request waits for it.
const remoteTimeout = 5 * time.Second

// remoteConns bounds the view's connections to gpuletd, and so the requests
// it has in flight: any user may read the view, and the view process is
// root's, whose connections --max-conns-per-uid does not cap. More readers
// wait for a connection.
const remoteConns = 8

// latestFor is how long the snapshot last loaded serves for attributes
// (Latest): a cat's stat before its open then costs no request of its own,
// and what stat shows is never older than this.
const latestFor = 100 * time.Millisecond

// NewRemote returns a Source that asks the gpuletd serving socket.
func NewRemote(socket string, log *slog.Logger) *Remote {
	return &Remote{
		c:   &client.Client{Socket: socket, MaxConns: remoteConns},
		log: ratelog.New(log, "view requests to gpuletd that failed", 1, nil),
	}
}

// Load returns the current snapshot, or nil while gpuletd does not answer.
func (r *Remote) Load() *snapshot.Published {
	r.mu.Lock()
	cur, tag := r.cur, r.etag
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), remoteTimeout)
	defer cancel()
	asked := time.Now()
	raw, etag, err := r.c.SnapshotIfChanged(ctx, tag)
	if err != nil {
		r.log.Log(slog.LevelWarn, "the view cannot have gpuletd's snapshot", "err", err)
		return nil
	}
	r.mu.Lock()
	switch {
	case raw == nil:
		if r.cur == cur && asked.After(r.asked) {
			r.asked = asked
		}
		r.mu.Unlock()
		return cur
	case r.cur != nil && etag != "" && etag == r.etag:
		// Another Load, answered meanwhile, holds this very snapshot.
		same := r.cur
		r.mu.Unlock()
		return same
	}
	r.mu.Unlock()
	var s api.Snapshot
	if err := json.Unmarshal(raw, &s); err != nil {
		r.log.Log(slog.LevelWarn, "the view cannot read gpuletd's snapshot", "err", err)
		return nil
	}
	// What a file asks for later comes with the snapshot, once; should
	// asking fail, the snapshot is not kept, so that the next Load asks
	// again rather than serve the failure for as long as nothing changes.
	p := snapshot.NewEncoded(&s, raw, func() []api.Lease { return r.leases(etag) }, func(*api.Snapshot) []byte { return r.metrics(etag) })
	r.mu.Lock()
	// Of two answers that crossed, the newer stays.
	if r.cur == nil || r.cur.Snapshot.BootID != s.BootID || r.cur.Snapshot.Seq < s.Seq {
		r.cur, r.etag, r.asked = p, etag, asked
	}
	r.mu.Unlock()
	return p
}

// Latest returns the snapshot last loaded if it was asked for within
// latestFor, without asking gpuletd; nil otherwise.
func (r *Remote) Latest() *snapshot.Published {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.asked) >= latestFor {
		return nil
	}
	return r.cur
}

// forget drops the snapshot of etag, whose lease list or metrics could not
// be had, so that the next Load asks for the snapshot whole.
func (r *Remote) forget(etag string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.etag == etag {
		r.cur, r.etag = nil, ""
	}
}

// leases lists every live lease, by id (the view's process is root's, and
// root sees them all).
func (r *Remote) leases(etag string) []api.Lease {
	ctx, cancel := context.WithTimeout(context.Background(), remoteTimeout)
	defer cancel()
	list, err := r.c.Leases(ctx)
	if err != nil {
		r.log.Log(slog.LevelWarn, "the view cannot list the leases", "err", err)
		r.forget(etag)
		return nil
	}
	slices.SortFunc(list, func(a, b api.Lease) int { return strings.Compare(a.ID, b.ID) })
	return list
}

// metrics is gpuletd's Prometheus text, as GET /metrics answers it.
func (r *Remote) metrics(etag string) []byte {
	ctx, cancel := context.WithTimeout(context.Background(), remoteTimeout)
	defer cancel()
	out, err := r.c.Metrics(ctx)
	if err != nil {
		r.log.Log(slog.LevelWarn, "the view cannot read the metrics", "err", err)
		r.forget(etag)
	}
	return out
}
