package fsview

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpulet/gpulet/api"
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
	hc  *http.Client
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
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}
	return &Remote{
		hc: &http.Client{Timeout: remoteTimeout, Transport: &http.Transport{
			DialContext: dial, MaxConnsPerHost: remoteConns, MaxIdleConns: remoteConns, MaxIdleConnsPerHost: remoteConns,
			IdleConnTimeout: time.Minute,
		}},
		log: ratelog.New(log, "view requests to gpuletd that failed", 1, nil),
	}
}

// Load returns the current snapshot, or nil while gpuletd does not answer.
func (r *Remote) Load() *snapshot.Published {
	r.mu.Lock()
	cur, tag := r.cur, r.etag
	r.mu.Unlock()
	req, err := http.NewRequest(http.MethodGet, "http://gpulet/v1/snapshot", nil)
	if err != nil {
		return nil
	}
	if tag != "" {
		req.Header.Set("If-None-Match", tag)
	}
	asked := time.Now()
	resp, err := r.hc.Do(req)
	if err != nil {
		r.log.Log(slog.LevelWarn, "the view cannot reach gpuletd", "err", err)
		return nil
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNotModified:
		io.Copy(io.Discard, resp.Body)
		r.mu.Lock()
		if r.cur == cur && asked.After(r.asked) {
			r.asked = asked
		}
		r.mu.Unlock()
		return cur
	case http.StatusOK:
	default:
		io.Copy(io.Discard, resp.Body)
		r.log.Log(slog.LevelWarn, "gpuletd refused the view's request for its snapshot", "status", resp.StatusCode)
		return nil
	}
	etag := resp.Header.Get("ETag")
	r.mu.Lock()
	if same := r.cur; same != nil && etag != "" && etag == r.etag {
		// Another Load, answered meanwhile, holds this very snapshot.
		r.mu.Unlock()
		io.Copy(io.Discard, resp.Body)
		return same
	}
	r.mu.Unlock()
	raw, err := io.ReadAll(resp.Body)
	var s api.Snapshot
	if err == nil {
		err = json.Unmarshal(raw, &s)
	}
	if err != nil {
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
	var list api.LeaseList
	if err := r.get("/v1/leases", func(b []byte) error { return json.Unmarshal(b, &list) }); err != nil {
		r.log.Log(slog.LevelWarn, "the view cannot list the leases", "err", err)
		r.forget(etag)
		return nil
	}
	slices.SortFunc(list.Leases, func(a, b api.Lease) int { return strings.Compare(a.ID, b.ID) })
	return list.Leases
}

// metrics is gpuletd's Prometheus text.
func (r *Remote) metrics(etag string) []byte {
	var out []byte
	if err := r.get("/metrics", func(b []byte) error { out = b; return nil }); err != nil {
		r.log.Log(slog.LevelWarn, "the view cannot read the metrics", "err", err)
		r.forget(etag)
	}
	return out
}

func (r *Remote) get(path string, use func([]byte) error) error {
	resp, err := r.hc.Get("http://gpulet" + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d", path, resp.StatusCode)
	}
	return use(b)
}
