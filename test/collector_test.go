package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/collector"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// startCollector runs gpulet-collector on a free loopback port and returns
// its base URL.
func startCollector(t *testing.T, staleAfter string, extra ...string) string {
	t.Helper()
	return startCollectorWith(t, http.DefaultClient, "http", append([]string{"--stale-after", staleAfter}, extra...)...)
}

// startCollectorWith runs gpulet-collector with args on a free loopback port
// and waits until client reaches it by scheme; it returns its base URL.
func startCollectorWith(t *testing.T, client *http.Client, scheme string, args ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	log := &testutil.SyncBuffer{}
	cmd := exec.Command(e2e.Bin("gpulet-collector"), append([]string{"--listen", addr}, args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("gpulet-collector exited with %v after SIGTERM", err)
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Error("gpulet-collector did not stop within 10s of SIGTERM")
		}
		if t.Failed() {
			t.Logf("gpulet-collector log:\n%s", log.String())
		}
	})
	base := scheme + "://" + addr
	testutil.Eventually(t, "gpulet-collector answers", func() bool {
		resp, err := client.Get(base + "/v1/nodes")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return base
}

// getJSON GETs url into v and fails the test on any error.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v\n%s", url, err, b)
	}
}

func collectorNodes(t *testing.T, base string) map[string]collector.Node {
	t.Helper()
	var l collector.NodeList
	getJSON(t, base+"/v1/nodes", &l)
	m := map[string]collector.Node{}
	for _, n := range l.Nodes {
		m[n.Node] = n
	}
	return m
}

func collectorRows(t *testing.T, base, query string) []collector.Row {
	t.Helper()
	var tb collector.Table
	getJSON(t, base+"/v1/table?"+query, &tb)
	return tb.Rows
}

func postSnapshot(t *testing.T, base string, b []byte) (int, string) {
	t.Helper()
	resp, err := http.Post(base+"/v1/snapshots", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// TestCollectorWithRealNodes: two real gpuletd push to a real collector,
// which shows both with their GPUs, follows a lease and a restart (new
// boot_id), drops a reordered snapshot, refuses a malformed one, turns a
// stopped node not_working after --stale-after, and serves promtool-clean
// metrics.
func TestCollectorWithRealNodes(t *testing.T) {
	base := startCollector(t, "1s")
	up := base + "/v1/snapshots"
	n1 := e2e.Start(t, "--upstream", up, "--report-interval", "200ms", "--node-name", "n1")
	n2 := e2e.Start(t, "--upstream", up, "--report-interval", "200ms", "--node-name", "n2", "--sim-gpus", "1xT4")
	s1, err := n1.Client.Snapshot(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}

	testutil.Eventually(t, "both nodes working in /v1/nodes", func() bool {
		m := collectorNodes(t, base)
		return m["n1"].State == "working" && m["n2"].State == "working"
	})
	nodes := collectorNodes(t, base)
	if nodes["n1"].GPUs != len(s1.GPUs) || nodes["n2"].GPUs != 1 || nodes["n1"].BootID != s1.BootID {
		t.Fatalf("nodes %+v; n1 has %d GPUs, boot %s", nodes, len(s1.GPUs), s1.BootID)
	}
	rows := collectorRows(t, base, "")
	if len(rows) != len(s1.GPUs)+1 || rows[0].Node != "n1" || rows[len(rows)-1].Node != "n2" || rows[len(rows)-1].Name != "Tesla T4" {
		t.Fatalf("table %+v", rows)
	}
	if t4 := collectorRows(t, base, "type=t4"); len(t4) != 1 || t4[0].Node != "n2" {
		t.Fatalf("type=t4: %+v", t4)
	}

	l, err := n1.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"})
	if err != nil {
		t.Fatal(err)
	}
	q := fmt.Sprintf("node=n1&limit=%d", l.GPU.Index+1)
	freeBefore := s1.GPUs[l.GPU.Index].UnitsFree
	testutil.Eventually(t, "the lease in the table", func() bool {
		r := collectorRows(t, base, q)
		return len(r) == l.GPU.Index+1 && r[l.GPU.Index].UnitsFree == freeBefore-1
	})

	// A restart is a new boot_id: its seq starts again and is accepted.
	oldBoot := collectorNodes(t, base)["n1"].BootID
	if err := n1.Stop(); err != nil {
		t.Fatal(err)
	}
	n1.Restart()
	testutil.Eventually(t, "n1's new boot_id", func() bool {
		n := collectorNodes(t, base)["n1"]
		return n.BootID != oldBoot && n.State == "working"
	})

	// A reordered old snapshot (the seq the collector has, or below) is
	// dropped with 204 and changes nothing.
	cur, err := n1.Client.Snapshot(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "n1's current seq in the collector", func() bool {
		n := collectorNodes(t, base)["n1"]
		return n.BootID == cur.BootID && n.Seq >= cur.Seq
	})
	old := *cur
	old.GPUs = append([]api.GPU(nil), cur.GPUs...)
	old.GPUs[0].Name = "POISON"
	old.GPUs[0].UnitsFree = 0
	b, _ := json.Marshal(old)
	if code, body := postSnapshot(t, base, b); code != 204 {
		t.Fatalf("reordered snapshot: %d %s", code, body)
	}
	for _, r := range collectorRows(t, base, "node=n1") {
		if r.Name == "POISON" {
			t.Fatalf("a dropped snapshot changed the rows: %+v", r)
		}
	}

	bad := *cur
	bad.Seq = 0
	b, _ = json.Marshal(bad)
	if code, body := postSnapshot(t, base, b); code != 400 || !strings.Contains(body, "seq") {
		t.Fatalf("snapshot without seq: %d %s", code, body)
	}
	if code, body := postSnapshot(t, base, []byte(`{"schema":"gpulet.snapshot/v1","node":"n9","boot_id":"x","seq":1,"state":"working","units_free":-4}`)); code != 400 || !strings.Contains(body, "units_free") {
		t.Fatalf("negative units_free: %d %s", code, body)
	}

	// n2 goes silent: after --stale-after it and its GPUs are not_working;
	// n1 keeps pushing and stays working.
	if err := n2.Stop(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "n2 not_working", func() bool { return collectorNodes(t, base)["n2"].State == collector.NotWorking })
	if n := collectorNodes(t, base)["n1"]; n.State != "working" {
		t.Fatalf("n1 is %s", n.State)
	}
	for _, r := range collectorRows(t, base, "node=n2") {
		if r.GPUState != collector.NotWorking || r.NodeState != collector.NotWorking {
			t.Fatalf("n2's row %+v", r)
		}
	}
	if r := collectorRows(t, base, "eligible=true"); len(r) == 0 || slicesHasNode(r, "n2") {
		t.Fatalf("eligible=true: %+v", r)
	}

	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`gpulet_collector_nodes{state="not_working"} 1`, `gpulet_collector_snapshots_total{outcome="rejected"} 2`, `gpulet_collector_snapshots_total{outcome="dropped"}`} {
		if !bytes.Contains(metrics, []byte(want)) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed:", err)
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(metrics)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

func slicesHasNode(rows []collector.Row, node string) bool {
	for _, r := range rows {
		if r.Node == node {
			return true
		}
	}
	return false
}
