package test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/e2e"
)

// TestUpstreamReceivesSnapshots: gpuletd pushes its snapshot to a real
// receiver at start and when a lease changes the node, seqs never going
// back; gpulet status and /metrics say how pushing goes.
func TestUpstreamReceivesSnapshots(t *testing.T) {
	var mu sync.Mutex
	var got []api.Snapshot
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var s api.Snapshot
		if err := json.NewDecoder(r.Body).Decode(&s); err != nil || s.Schema != api.SnapshotSchema {
			http.Error(w, "not a snapshot", 400)
			return
		}
		mu.Lock()
		got = append(got, s)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer rcv.Close()
	d := e2e.Start(t, "--upstream", rcv.URL+"/v1/snapshots", "--report-interval", "1h")
	last := func() api.Snapshot {
		mu.Lock()
		defer mu.Unlock()
		if len(got) == 0 {
			return api.Snapshot{}
		}
		return got[len(got)-1]
	}
	e2e.Eventually(t, "the first push", func() bool { return last().Seq > 0 })
	l, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"})
	if err != nil {
		t.Fatal(err)
	}
	e2e.Eventually(t, "the lease pushed", func() bool {
		s := last()
		return len(s.GPUs) > l.GPU.Index && s.GPUs[l.GPU.Index].UnitsUsed == 1
	})
	mu.Lock()
	for i := 1; i < len(got); i++ {
		if got[i].BootID == got[i-1].BootID && got[i].Seq < got[i-1].Seq {
			t.Errorf("seq went back: %d after %d", got[i].Seq, got[i-1].Seq)
		}
	}
	mu.Unlock()
	// The next snapshot shows the push state; a release makes one.
	if err := d.Client.Release(e2e.Ctx(t), l.ID); err != nil {
		t.Fatal(err)
	}
	out, code := gpulet(t, d, "status")
	if code != 0 || !strings.Contains(out, "upstream "+rcv.URL+"/v1/snapshots: last push") {
		t.Fatalf("gpulet status: exit %d\n%s", code, out)
	}
	resp, err := d.HTTP().Get("http://gpulet/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `gpulet_upstream_failures{url="`+rcv.URL+`/v1/snapshots"} 0`) {
		t.Fatalf("/metrics lacks the upstream's state")
	}
}
