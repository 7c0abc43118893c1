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

	mu   sync.Mutex // guards cur and etag
	cur  *snapshot.Published
	etag string
}

// remoteTimeout bounds one request to gpuletd: a FUSE request waits for it.
const remoteTimeout = 5 * time.Second

// remoteConns is how many connections to gpuletd the view keeps open: one
// for each request it serves at once.
const remoteConns = 8

// NewRemote returns a Source that asks the gpuletd serving socket.
func NewRemote(socket string, log *slog.Logger) *Remote {
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}
	return &Remote{
		hc: &http.Client{Timeout: remoteTimeout, Transport: &http.Transport{
			DialContext: dial, MaxIdleConns: remoteConns, MaxIdleConnsPerHost: remoteConns, IdleConnTimeout: time.Minute,
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
	resp, err := r.hc.Do(req)
	if err != nil {
		r.log.Log(slog.LevelWarn, "the view cannot reach gpuletd", "err", err)
		return nil
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNotModified:
		io.Copy(io.Discard, resp.Body)
		return cur
	case http.StatusOK:
	default:
		io.Copy(io.Discard, resp.Body)
		r.log.Log(slog.LevelWarn, "gpuletd refused the view's request for its snapshot", "status", resp.StatusCode)
		return nil
	}
	raw, err := io.ReadAll(resp.Body)
	var s api.Snapshot
	if err == nil {
		err = json.Unmarshal(raw, &s)
	}
	if err != nil {
		r.log.Log(slog.LevelWarn, "the view cannot read gpuletd's snapshot", "err", err)
		return nil
	}
	p := snapshot.NewEncoded(&s, raw, r.leases, r.metrics)
	r.mu.Lock()
	// Of two answers that crossed, the newer stays.
	if r.cur == nil || r.cur.Snapshot.BootID != s.BootID || r.cur.Snapshot.Seq < s.Seq {
		r.cur, r.etag = p, resp.Header.Get("ETag")
	}
	r.mu.Unlock()
	return p
}

// Latest returns the snapshot Load last returned, without asking gpuletd.
func (r *Remote) Latest() *snapshot.Published {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// leases lists every live lease, by id (the view's process is root's, and
// root sees them all).
func (r *Remote) leases() []api.Lease {
	var list api.LeaseList
	if err := r.get("/v1/leases", func(b []byte) error { return json.Unmarshal(b, &list) }); err != nil {
		r.log.Log(slog.LevelWarn, "the view cannot list the leases", "err", err)
		return nil
	}
	slices.SortFunc(list.Leases, func(a, b api.Lease) int { return strings.Compare(a.ID, b.ID) })
	return list.Leases
}

// metrics is gpuletd's Prometheus text.
func (r *Remote) metrics(*api.Snapshot) []byte {
	var out []byte
	if err := r.get("/metrics", func(b []byte) error { out = b; return nil }); err != nil {
		r.log.Log(slog.LevelWarn, "the view cannot read the metrics", "err", err)
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
