package bench

import (
	"bytes"
	"fmt"
	"net/http"

	"github.com/gpulet/gpulet/internal/testutil"
)

// benchClient is one client of a benchmark's team: a keep-alive net/http
// client for the ops that read what they get, and a raw connection for the
// ops whose figures are a server's throughput.
type benchClient struct {
	*http.Client
	sock string
	raw  *testutil.RawConn
}

func newBenchClient(sock string) *benchClient {
	return &benchClient{Client: httpClient(sock), sock: sock}
}

func (c *benchClient) close() {
	c.CloseIdleConnections()
	if c.raw != nil {
		c.raw.Close()
	}
}

// rawClient is c's raw connection, dialled at first use.
func (c *benchClient) rawClient() (*testutil.RawConn, error) {
	if c.raw == nil {
		raw, err := testutil.DialRaw("unix", c.sock, "gpulet")
		if err != nil {
			return nil, err
		}
		c.raw = raw
	}
	return c.raw, nil
}

var (
	leaseRequest = []byte(`{"units":1,"ttl":"1m"}`)
	idField      = []byte(`"id":"`)
)

// leaseRelease is POST /v1/leases for one unit with a ttl, then DELETE of the
// lease it returned, on c's raw connection.
func leaseRelease(c *benchClient) error {
	rc, err := c.rawClient()
	if err != nil {
		return err
	}
	status, body, err := rc.Do(http.MethodPost, "/v1/leases", leaseRequest)
	if err != nil {
		return err
	}
	if status != http.StatusCreated {
		return fmt.Errorf("lease: HTTP %d: %s", status, body)
	}
	_, rest, ok := bytes.Cut(body, idField)
	end := bytes.IndexByte(rest, '"')
	if !ok || end <= 0 {
		return fmt.Errorf("lease: no id in %q", body)
	}
	path := "/v1/leases/" + string(rest[:end])
	if status, body, err = rc.Do(http.MethodDelete, path, nil); err != nil {
		return err
	}
	if status != http.StatusNoContent {
		return fmt.Errorf("release %s: HTTP %d: %s", path, status, body)
	}
	return nil
}
