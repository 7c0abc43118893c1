package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/internal/e2e"
)

func getSnapshot(c *http.Client) error {
	resp, err := c.Get("http://gpulet/v1/snapshot")
	if err != nil {
		return err
	}
	drain(resp)
	if resp.StatusCode != 200 {
		return fmt.Errorf("snapshot: HTTP %d", resp.StatusCode)
	}
	return nil
}

// BenchmarkSnapshot: GET /v1/snapshot on gpuletd vs a bare net/http handler
// returning the same bytes.
func BenchmarkSnapshot(b *testing.B) {
	d := e2e.Start(b, "--sample-interval", "1s", "--run-dir", tmpfsRunDir(b))
	body, err := d.Client.SnapshotJSON(e2e.Ctx(b))
	if err != nil {
		b.Fatal(err)
	}
	floor := floorServer(b, body)
	for _, clients := range []int{1, 8} {
		b.Run(fmt.Sprintf("floor/clients=%d", clients), func(b *testing.B) { run(b, floor, clients, getSnapshot) })
		b.Run(fmt.Sprintf("gpuletd/clients=%d", clients), func(b *testing.B) { run(b, d.Socket, clients, getSnapshot) })
	}
}

// leaseRelease is one POST /v1/leases and one DELETE of what it returned.
func leaseRelease(c *http.Client) error {
	resp, err := c.Post("http://gpulet/v1/leases", "application/json", strings.NewReader(`{"units":1,"ttl":"1m"}`))
	if err != nil {
		return err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("lease: HTTP %d %s", resp.StatusCode, b)
	}
	var l struct{ ID string }
	if err := json.Unmarshal(b, &l); err != nil {
		return err
	}
	req, _ := http.NewRequest("DELETE", "http://gpulet/v1/leases/"+l.ID, nil)
	resp, err = c.Do(req)
	if err != nil {
		return err
	}
	drain(resp)
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("release: HTTP %d", resp.StatusCode)
	}
	return nil
}

// BenchmarkLeaseRelease: a lease and its release on gpuletd vs a server that
// answers the same two requests with canned bodies.
func BenchmarkLeaseRelease(b *testing.B) {
	d := e2e.Start(b, "--clients-per-instance", "64", "--sample-interval", "1s", "--run-dir", tmpfsRunDir(b))
	canned := []byte(`{"id":"l-0123456789abcdef","gpu":{"index":0,"uuid":"GPU-x"},"instance":0,"units":[0],"owner":{"uid":0,"gid":0,"pid":0},"created":"2026-11-23T10:00:00Z","expires":"2026-11-23T10:01:00Z","ttl":"1m0s","preemptible":false,"env":{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE":"2","CUDA_VISIBLE_DEVICES":"GPU-x"}}` + "\n")
	floor := floorServer(b, canned)
	for _, clients := range []int{1, 8} {
		b.Run(fmt.Sprintf("floor/clients=%d", clients), func(b *testing.B) { run(b, floor, clients, leaseRelease) })
		b.Run(fmt.Sprintf("gpuletd/clients=%d", clients), func(b *testing.B) { run(b, d.Socket, clients, leaseRelease) })
	}
}
