// Package client is the Go client of gpuletd's socket API. Its zero value
// works: it talks to the socket named by GPULET_SOCKET, or /run/gpulet/gpulet.sock.
//
// Errors from the API match the sentinels below with errors.Is, e.g.
//
//	if errors.Is(err, client.ErrInsufficientUnits) { ... }
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"

	"github.com/gpulet/gpulet/api"
)

// DefaultSocket is where gpuletd listens unless told otherwise.
const DefaultSocket = api.DefaultSocket

// SocketEnv names the environment variable that overrides DefaultSocket.
const SocketEnv = "GPULET_SOCKET"

// Errors the API answers with; test with errors.Is.
var (
	ErrBadRequest        = api.ErrBadRequest
	ErrNotFound          = api.ErrNotFound
	ErrForbidden         = api.ErrForbidden
	ErrInsufficientUnits = api.ErrInsufficientUnits
	ErrQuotaExceeded     = api.ErrQuotaExceeded
	ErrUnavailable       = api.ErrUnavailable
	ErrMethodNotAllowed  = api.ErrMethodNotAllowed
	ErrRequestTooLarge   = api.ErrRequestTooLarge
	// ErrTooManyRequests: the caller's user has as many requests waiting for
	// units as gpuletd allows one user (--max-waiters-per-uid).
	ErrTooManyRequests = api.ErrTooManyRequests
	// ErrConflict: a reservation of that name exists already.
	ErrConflict = api.ErrConflict
	// ErrNoDaemon means nothing answered on the socket.
	ErrNoDaemon = errors.New("gpuletd not reachable")
)

// Client talks to one gpuletd. The zero value is ready to use.
type Client struct {
	// Socket is the daemon's socket; empty: GPULET_SOCKET, else DefaultSocket.
	Socket string
	// Transport overrides the HTTP transport (tests, custom dialers).
	Transport http.RoundTripper
	// MaxConns bounds the connections open to the daemon at once; more
	// requests wait for one (0: no bound). Unused with Transport.
	MaxConns int

	once sync.Once
	http *http.Client
}

// SocketPath is the socket the client uses.
func (c *Client) SocketPath() string {
	if c.Socket != "" {
		return c.Socket
	}
	if s := os.Getenv(SocketEnv); s != "" {
		return s
	}
	return DefaultSocket
}

func (c *Client) client() *http.Client {
	c.once.Do(func() {
		rt := c.Transport
		if rt == nil {
			path := c.SocketPath()
			rt = &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, "unix", path)
				},
				MaxIdleConnsPerHost: 8,
				MaxConnsPerHost:     c.MaxConns,
			}
		}
		c.http = &http.Client{Transport: rt}
	})
	return c.http
}

// send makes one request; body, when not nil, is sent as JSON; a 2xx answer is
// decoded into out when out is not nil.
func (c *Client) send(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://gpulet"+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	_, b, err := c.do(req)
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	if raw, ok := out.(*[]byte); ok {
		*raw = b
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decoding gpuletd's answer to %s %s: %w", method, path, err)
	}
	return nil
}

// do makes one request and reads the answer whole: a 2xx or 304 answer is
// returned, anything else is the error it says.
func (c *Client) do(req *http.Request) (*http.Response, []byte, error) {
	if c.Transport == nil {
		if err := CheckSocketPath(c.SocketPath()); err != nil {
			return nil, nil, fmt.Errorf("cannot reach gpuletd: %w (%w)", err, ErrNoDaemon)
		}
	}
	resp, err := c.client().Do(req)
	if err != nil {
		if ctx := req.Context(); ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		if errors.Is(err, syscall.EACCES) {
			return nil, nil, fmt.Errorf("cannot reach gpuletd at %s: %w: %s (%w)", c.SocketPath(), ErrPermission, permissionAdvice(c.SocketPath()), ErrNoDaemon)
		}
		return nil, nil, fmt.Errorf("cannot reach gpuletd at %s: is it running? (%w: %v)", c.SocketPath(), ErrNoDaemon, unwrapDial(err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("reading gpuletd's answer: %w", err)
	}
	if resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusNotModified {
		var eb api.ErrorBody
		if json.Unmarshal(b, &eb) != nil || eb.Error.Code == "" {
			return nil, nil, fmt.Errorf("gpuletd answered HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
		}
		return nil, nil, api.FromBody(resp.StatusCode, eb)
	}
	return resp, b, nil
}

func unwrapDial(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}

// Snapshot returns the node's snapshot.
func (c *Client) Snapshot(ctx context.Context) (*api.Snapshot, error) {
	return c.snapshotFrom(ctx, "GET", "/v1/snapshot")
}

// call sends one request and decodes its answer into a new T.
func call[T any](ctx context.Context, c *Client, method, path string, body any) (*T, error) {
	var out T
	if err := c.send(ctx, method, path, body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func (c *Client) snapshotFrom(ctx context.Context, method, path string) (*api.Snapshot, error) {
	return call[api.Snapshot](ctx, c, method, path, nil)
}

// SnapshotJSON returns the snapshot's bytes as the daemon sent them.
func (c *Client) SnapshotJSON(ctx context.Context) ([]byte, error) {
	var b []byte
	return b, c.send(ctx, "GET", "/v1/snapshot", nil, &b)
}

// SnapshotIfChanged returns the snapshot's bytes as the daemon sent them and
// its ETag, unless the daemon's snapshot is still the one tagged etag: then
// raw is nil and tag is etag, and the answer was a few bytes. An empty etag
// asks for the snapshot whatever it is.
func (c *Client) SnapshotIfChanged(ctx context.Context, etag string) (raw []byte, tag string, err error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://gpulet/v1/snapshot", nil)
	if err != nil {
		return nil, "", err
	}
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	resp, b, err := c.do(req)
	switch {
	case err != nil:
		return nil, "", err
	case resp.StatusCode == http.StatusNotModified:
		return nil, etag, nil
	}
	return b, resp.Header.Get("ETag"), nil
}

// GPUs lists the GPUs.
func (c *Client) GPUs(ctx context.Context) (*api.GPUList, error) {
	return call[api.GPUList](ctx, c, "GET", "/v1/gpus", nil)
}

// Metrics returns the Prometheus text exposition.
func (c *Client) Metrics(ctx context.Context) ([]byte, error) {
	var b []byte
	return b, c.send(ctx, "GET", "/metrics", nil, &b)
}

// Lease asks for units.
func (c *Client) Lease(ctx context.Context, req api.LeaseRequest) (*api.Lease, error) {
	return call[api.Lease](ctx, c, "POST", "/v1/leases", req)
}

// Leases lists the caller's leases (every lease, for root and admins).
func (c *Client) Leases(ctx context.Context) ([]api.Lease, error) {
	var l api.LeaseList
	if err := c.send(ctx, "GET", "/v1/leases", nil, &l); err != nil {
		return nil, err
	}
	return l.Leases, nil
}

// LeasesAll lists every lease of the node: the caller's in full, other
// users' with their owner, GPU and units but no id, env or labels; only the
// caller's (and every lease, for root and admins) where gpuletd runs with
// --private-leases.
func (c *Client) LeasesAll(ctx context.Context) ([]api.Lease, error) {
	var l api.LeaseList
	if err := c.send(ctx, "GET", "/v1/leases?all=true", nil, &l); err != nil {
		return nil, err
	}
	return l.Leases, nil
}

// GetLease returns one lease.
func (c *Client) GetLease(ctx context.Context, id string) (*api.Lease, error) {
	return call[api.Lease](ctx, c, "GET", "/v1/leases/"+pathSegment(id), nil)
}

// Renew extends a lease that has a ttl.
func (c *Client) Renew(ctx context.Context, id string) (*api.Lease, error) {
	return call[api.Lease](ctx, c, "POST", "/v1/leases/"+pathSegment(id)+"/renew", nil)
}

// Release ends a lease.
func (c *Client) Release(ctx context.Context, id string) error {
	return c.send(ctx, "DELETE", "/v1/leases/"+pathSegment(id), nil, nil)
}

// Drain stops new leases on the node (admins).
func (c *Client) Drain(ctx context.Context) (*api.Snapshot, error) {
	return c.snapshotFrom(ctx, "POST", "/v1/node/drain")
}

// Undrain resumes new leases (admins).
func (c *Client) Undrain(ctx context.Context) (*api.Snapshot, error) {
	return c.snapshotFrom(ctx, "POST", "/v1/node/undrain")
}

// UndrainGPU clears the Xid fault of one GPU, named by index or UUID, so that
// it takes leases again (admins); the node's draining is left as it is.
func (c *Client) UndrainGPU(ctx context.Context, gpu string) (*api.Snapshot, error) {
	return call[api.Snapshot](ctx, c, "POST", "/v1/node/undrain", api.UndrainRequest{GPU: gpu})
}

// SetSimGPU changes what a simulated GPU reports (simulated backend, root).
func (c *Client) SetSimGPU(ctx context.Context, index int, u api.SimGPUUpdate) (*api.GPU, error) {
	return call[api.GPU](ctx, c, "POST", fmt.Sprintf("/v1/sim/gpus/%d", index), u)
}

// Place is the dry run of a lease: where it would go now, changing nothing.
func (c *Client) Place(ctx context.Context, req api.LeaseRequest) (*api.Placement, error) {
	return call[api.Placement](ctx, c, "POST", "/v1/placements", req)
}

// Profiles returns the task–engine affinity table.
func (c *Client) Profiles(ctx context.Context) (*api.ProfileList, error) {
	return call[api.ProfileList](ctx, c, "GET", "/v1/profiles", nil)
}

// Pools lists the configured pools and whether the caller may use each.
func (c *Client) Pools(ctx context.Context) (*api.PoolList, error) {
	return call[api.PoolList](ctx, c, "GET", "/v1/pools", nil)
}

// Quotas lists the quotas that apply to the caller, with what it holds.
func (c *Client) Quotas(ctx context.Context) (*api.QuotaList, error) {
	return call[api.QuotaList](ctx, c, "GET", "/v1/quotas", nil)
}

// Reserve makes a workflow reservation: its largest stage's units are set
// aside at once, or, with req.Wait, as soon as they can be had.
func (c *Client) Reserve(ctx context.Context, req api.ReservationRequest) (*api.Reservation, error) {
	return call[api.Reservation](ctx, c, "POST", "/v1/reservations", req)
}

// Reservations lists the node's reservations.
func (c *Client) Reservations(ctx context.Context) ([]api.Reservation, error) {
	var l api.ReservationList
	if err := c.send(ctx, "GET", "/v1/reservations", nil, &l); err != nil {
		return nil, err
	}
	return l.Reservations, nil
}

// GetReservation returns one reservation.
func (c *Client) GetReservation(ctx context.Context, name string) (*api.Reservation, error) {
	return call[api.Reservation](ctx, c, "GET", "/v1/reservations/"+pathSegment(name), nil)
}

// Advance starts a reservation's next stage, taking lent units back when the
// stage needs them; past the last stage the reservation ends (state
// "ended").
func (c *Client) Advance(ctx context.Context, name string) (*api.Reservation, error) {
	return call[api.Reservation](ctx, c, "POST", "/v1/reservations/"+pathSegment(name)+"/advance", nil)
}

// Unreserve ends a reservation; its units go back to the node.
func (c *Client) Unreserve(ctx context.Context, name string) error {
	return c.send(ctx, "DELETE", "/v1/reservations/"+pathSegment(name), nil, nil)
}
