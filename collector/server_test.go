package collector

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

func do(t *testing.T, h http.Handler, method, target string, b []byte) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if b != nil {
		rd = bytes.NewReader(b)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, target, rd))
	return rec.Code, rec.Body.Bytes()
}

func errorMessage(t *testing.T, b []byte) string {
	t.Helper()
	var e api.ErrorBody
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("error body %q: %v", b, err)
	}
	return e.Error.Code + ": " + e.Error.Message
}

func TestServerSnapshots(t *testing.T) {
	clock := newFakeClock()
	s := NewServer(NewStore(15*time.Second, clock.Now), nil)
	post := func(b []byte) (int, []byte) { return do(t, s, "POST", "/v1/snapshots", b) }
	if code, b := post(body(t, testSnapshot("n1", "b1", 3, 4, 2), nil)); code != 204 {
		t.Fatalf("valid snapshot: %d %s", code, b)
	}
	if code, b := post(body(t, testSnapshot("n1", "b1", 2, 1, 2), nil)); code != 204 {
		t.Fatalf("older snapshot: %d %s", code, b)
	}
	code, b := post(body(t, testSnapshot("n1", "b1", 4, 4, 2), func(m map[string]any) { gpu0(m)["units_free"] = -1 }))
	if msg := errorMessage(t, b); code != 400 || !strings.Contains(msg, "gpus[0].units_free") {
		t.Fatalf("bad snapshot: %d %s", code, msg)
	}
	big := append([]byte(`{"node":"`), bytes.Repeat([]byte("x"), MaxSnapshotBody)...)
	if code, b := post(big); code != 413 {
		t.Fatalf("big body: %d %s", code, b)
	}
	// Chunked, so that only reading finds it too large.
	req := httptest.NewRequest("POST", "/v1/snapshots", io.MultiReader(bytes.NewReader(big), strings.NewReader(`"}`)))
	req.ContentLength = -1
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	if rec.Code != 413 {
		t.Fatalf("big body without a length: %d", rec.Code)
	}

	code, b = do(t, s, "GET", "/v1/nodes", nil)
	var nodes NodeList
	if err := json.Unmarshal(b, &nodes); code != 200 || err != nil {
		t.Fatalf("nodes: %d %s", code, b)
	}
	if len(nodes.Nodes) != 1 || nodes.Nodes[0].Seq != 3 || nodes.Nodes[0].GPUs != 2 || nodes.Nodes[0].UnitsFree != 7 || nodes.Nodes[0].State != "working" {
		t.Fatalf("nodes %+v", nodes)
	}
	for _, field := range []string{`"node"`, `"state"`, `"boot_id"`, `"seq"`, `"last_seen"`, `"units_total"`, `"units_free"`, `"units_reserved"`, `"gpus"`} {
		if !bytes.Contains(b, []byte(field)) {
			t.Errorf("/v1/nodes lacks %s", field)
		}
	}

	code, b = do(t, s, "GET", "/v1/table?type=a100&min_free=4", nil)
	var table Table
	if err := json.Unmarshal(b, &table); code != 200 || err != nil {
		t.Fatalf("table: %d %s", code, b)
	}
	if len(table.Rows) != 1 || table.Rows[0].GPUUUID != "GPU-n1-0" || table.Rows[0].UnitsFree != 4 {
		t.Fatalf("table %+v", table)
	}
	for _, field := range []string{"node", "node_state", "gpu_index", "gpu_uuid", "name", "gpu_state", "eligible", "units_total", "units_used", "units_free", "units_reserved", "utilization_pct", "memory_total_mib", "memory_used_mib"} {
		if !bytes.Contains(b, []byte(`"`+field+`":`)) {
			t.Errorf("/v1/table lacks %s", field)
		}
	}
	code, b = do(t, s, "GET", "/v1/table?limit=0", nil)
	if msg := errorMessage(t, b); code != 400 || !strings.Contains(msg, "limit") {
		t.Fatalf("bad limit: %d %s", code, msg)
	}

	for _, c := range []struct {
		method, path string
		code         int
	}{{"GET", "/v1/snapshots", 405}, {"POST", "/v1/table", 405}, {"GET", "/v2/x", 404}, {"GET", "/v1/nodes?x=1", 400}} {
		if code, b := do(t, s, c.method, c.path, nil); code != c.code {
			t.Errorf("%s %s: %d %s, want %d", c.method, c.path, code, b, c.code)
		}
	}

	code, b = do(t, s, "GET", "/metrics", nil)
	if code != 200 {
		t.Fatalf("metrics: %d", code)
	}
	for _, want := range []string{
		`gpulet_collector_snapshots_total{outcome="applied"} 1`,
		`gpulet_collector_snapshots_total{outcome="dropped"} 1`,
		`gpulet_collector_snapshots_total{outcome="rejected"} 3`,
		`gpulet_collector_nodes{state="working"} 1`,
		`gpulet_collector_nodes{state="not_working"} 0`,
		`gpulet_collector_table_rows 2`,
	} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if promtool, err := exec.LookPath("promtool"); err == nil {
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = bytes.NewReader(b)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool check metrics: %v\n%s", err, out)
		}
	} else if os.Getenv("CI") != "" {
		t.Error("promtool is not installed")
	}
}

// A full table refuses new nodes (503) and keeps taking the ones it has; a
// collector with a token refuses snapshots without it.
func TestMaxNodesAndToken(t *testing.T) {
	st := NewStore(time.Minute, nil)
	st.MaxNodes = 1
	s := NewServer(st, nil)
	s.Auth.PushToken = tokenFile(t, "sesame\n")
	post := func(node string, seq uint64, auth string) int {
		b, _ := json.Marshal(testSnapshot(node, "b", seq, 4, 1))
		req := httptest.NewRequest("POST", "/v1/snapshots", bytes.NewReader(b))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		return rec.Code
	}
	if code := post("n1", 1, ""); code != 403 {
		t.Fatalf("no token: %d, want 403", code)
	}
	if code := post("n1", 1, "Bearer wrong"); code != 403 {
		t.Fatalf("wrong token: %d, want 403", code)
	}
	if code := post("n1", 1, "Bearer sesame"); code != 204 {
		t.Fatalf("first node: %d, want 204", code)
	}
	if code := post("n2", 1, "Bearer sesame"); code != 503 {
		t.Fatalf("a node past --max-nodes: %d, want 503", code)
	}
	if code := post("n1", 2, "Bearer sesame"); code != 204 || st.Nodes().Nodes[0].Seq != 2 {
		t.Fatalf("the node it has: %d", code)
	}
}
