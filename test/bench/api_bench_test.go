package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/test/e2e"
)

// BenchmarkSnapshot is GET /v1/snapshot through the real gpuletd against the
// floors serving the very bytes gpuletd served, at 1 and 8 concurrent
// keep-alive clients. Goal: gpuletd within 1.5× floor-proc.
func BenchmarkSnapshot(b *testing.B) {
	d := startDaemon(b)
	body, err := d.Client.SnapshotJSON(e2e.Ctx(b))
	if err != nil {
		b.Fatal(err)
	}
	socks := map[string]string{
		"floor":      floorServer(b, body, nil),
		"floor-proc": floorProcess(b, body, nil),
		"gpuletd":    d.Socket,
	}
	compare(b, socks, getSnapshot)
}

// compare runs op at 1 and 8 clients on every server of socks, one after the
// other, floors first; gpuletd's runs report their ratio to the in-process
// floor's (x-inproc-*). Then "paired" runs gpuletd and floor-proc in
// alternating turns and reports gpuletd's ratio to floor-proc (x-floor-*):
// the figure the goals are checked against.
func compare(b *testing.B, socks map[string]string, op func(*http.Client) error) {
	for _, clients := range []int{1, 8} {
		var inproc result
		for _, name := range []string{"floor", "floor-proc", "gpuletd"} {
			b.Run(fmt.Sprintf("clients=%d/%s", clients, name), func(b *testing.B) {
				r := run(b, socks[name], clients, op)
				switch name {
				case "floor":
					inproc = r
				case "gpuletd":
					reportRatio(b, r, inproc, "inproc")
				}
			})
		}
		b.Run(fmt.Sprintf("clients=%d/paired", clients), func(b *testing.B) {
			paired(b, socks["floor-proc"], socks["gpuletd"], clients, op)
		})
	}
}

// baselineEnv names a gpuletd binary for BenchmarkLeaseReleaseAgainstBaseline.
const baselineEnv = "GPULET_BENCH_BASELINE"

// BenchmarkLeaseReleaseAgainstBaseline runs lease+release on this gpuletd and
// on the gpuletd binary that GPULET_BENCH_BASELINE names (say, built from an
// earlier commit), side by side in alternating turns, and reports this one's
// ratios to it (x-baseline-*): how a change moved leasing, measured at the
// same moments of a machine whose speed drifts. Without the variable it is
// skipped.
func BenchmarkLeaseReleaseAgainstBaseline(b *testing.B) {
	baseline := os.Getenv(baselineEnv)
	if baseline == "" {
		b.Skipf("set %s to a gpuletd binary to compare against, such as one built from an earlier commit", baselineEnv)
	}
	flags := []string{"--clients-per-instance", "64", "--units-per-gpu", "64"}
	base := startDaemonBinary(b, baseline, flags...)
	d := startDaemon(b, flags...)
	for _, clients := range []int{1, 8} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			alternate(b, clients, side{base.Socket, leaseRelease}, side{d.Socket, leaseRelease}, "baseline")
		})
	}
}

// leaseRelease is POST /v1/leases for one unit with a ttl, then DELETE of the
// lease it returned.
func leaseRelease(c *http.Client) error {
	resp, err := c.Post("http://gpulet/v1/leases", "application/json", strings.NewReader(`{"units":1,"ttl":"1m"}`))
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("lease: HTTP %d: %s", resp.StatusCode, body)
	}
	var l struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &l); err != nil || l.ID == "" {
		return fmt.Errorf("lease: no id in %q (%v)", body, err)
	}
	req, err := http.NewRequest(http.MethodDelete, "http://gpulet/v1/leases/"+l.ID, nil)
	if err != nil {
		return err
	}
	resp, err = c.Do(req)
	if err != nil {
		return err
	}
	drain(resp)
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("release %s: HTTP %d", l.ID, resp.StatusCode)
	}
	return nil
}

// BenchmarkLeaseRelease is a lease and its release through the real gpuletd
// against the floors answering the same two requests with a lease body
// gpuletd gave. gpuletd has 64 units per GPU, so 8 clients never run short.
// Goal: p99 within 2× and ops/s at least 0.5× floor-proc.
func BenchmarkLeaseRelease(b *testing.B) {
	d := startDaemon(b, "--clients-per-instance", "64", "--units-per-gpu", "64")
	c := httpClient(d.Socket)
	defer c.CloseIdleConnections()
	// One real lease gives the floors their canned answer.
	resp, err := c.Post("http://gpulet/v1/leases", "application/json", strings.NewReader(`{"units":1,"ttl":"1m"}`))
	if err != nil {
		b.Fatal(err)
	}
	leaseBody, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var l struct {
		ID string `json:"id"`
	}
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(leaseBody, &l) != nil {
		b.Fatalf("lease: HTTP %d: %s", resp.StatusCode, leaseBody)
	}
	if err := d.Client.Release(e2e.Ctx(b), l.ID); err != nil {
		b.Fatal(err)
	}
	socks := map[string]string{
		"floor":      floorServer(b, nil, leaseBody),
		"floor-proc": floorProcess(b, nil, leaseBody),
		"gpuletd":    d.Socket,
	}
	compare(b, socks, leaseRelease)
	// Against the contract floor: floor-proc plus the syscalls docs/design.md asks of
	// any daemon for a lease and its release (contractfloor_test.go).
	contract, _ := contractFloorProcess(b, nil, leaseBody)
	for _, clients := range []int{1, 8} {
		b.Run(fmt.Sprintf("clients=%d/paired-contract", clients), func(b *testing.B) {
			alternate(b, clients, side{contract, leaseRelease}, side{d.Socket, leaseRelease}, "contract")
		})
	}
	// Every lease was released: nothing may be left behind.
	if s, err := snapshot(c); err != nil || s.UnitsFree != s.UnitsTotal {
		b.Fatalf("after the benchmark: snapshot %+v, %v: leases left behind", s, err)
	}
}
