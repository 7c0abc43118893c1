package test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
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
	testutil.Eventually(t, "the first push", func() bool { return last().Seq > 0 })
	l, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the lease pushed", func() bool {
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

// TestUpstreamFailureMakesASnapshot: an upstream that starts failing, or
// works again, makes a new snapshot that says so, with nothing else on the
// node changing.
func TestUpstreamFailureMakesASnapshot(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if failing.Load() {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer rcv.Close()
	d := e2e.Start(t, "--upstream", rcv.URL+"/v1/snapshots", "--report-interval", "1h")
	upstream := func() api.UpstreamStatus {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		if err != nil || len(s.Upstreams) != 1 {
			t.Fatalf("snapshot: %v, upstreams %+v", err, s)
		}
		return s.Upstreams[0]
	}
	testutil.Eventually(t, "the snapshot shows the failure", func() bool { return upstream().Failures > 0 })
	failing.Store(false)
	testutil.Eventually(t, "the snapshot shows the recovery", func() bool {
		st := upstream()
		return st.Failures == 0 && st.LastSuccess != nil
	})
}

// TestUpstreamSecretsStayHidden: an upstream URL's userinfo and query
// appeared verbatim in gpulet status, over --listen and in the snapshot
// pushed to every other upstream. Now none of them shows a secret.
func TestUpstreamSecretsStayHidden(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer rcv.Close()
	secret := strings.Replace(rcv.URL, "http://", "http://user:pw-SECRET@", 1) + "/a?api_key=KEY-SECRET"
	d := e2e.Start(t, "--upstream", secret, "--upstream", rcv.URL+"/b", "--report-interval", "200ms", "--listen", anyPort)
	addr := listenAddr(t, d)
	testutil.Eventually(t, "pushes that show both upstreams", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(bodies) > 2 && strings.Contains(bodies[len(bodies)-1], `"pushes":`)
	})
	resp, err := http.Get("http://" + addr + "/v1/snapshot")
	if err != nil {
		t.Fatal(err)
	}
	overTCP, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	status, _ := gpulet(t, d, "status")
	local, err := d.Client.SnapshotJSON(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	pushed := strings.Join(bodies, "\n")
	mu.Unlock()
	for name, text := range map[string]string{"gpulet status": status, "--listen": string(overTCP), "the socket's snapshot": string(local), "pushes": pushed} {
		if strings.Contains(text, "SECRET") {
			t.Errorf("%s shows a secret of the upstream URL:\n%s", name, text)
		}
		if !strings.Contains(text, "redacted@") {
			t.Errorf("%s does not show the upstream, redacted:\n%s", name, text)
		}
	}
}
