package test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// TestSnapshotContract checks the snapshot of docs/design.md §8 field by field
// on the real daemon.
func TestSnapshotContract(t *testing.T) {
	// gpuletd pings the watchdog at the end of every sample tick: the pings
	// show the ticks that passed.
	notify := listenNotify(t)
	d := e2e.Start(t, "--sim-gpus", "2xA100-80GB,1xT4-16GB")
	raw, err := d.Client.SnapshotJSON(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"schema": "string", "node": "string", "boot_id": "string", "seq": "number", "time": "string",
		"state": "string", "backend": "string", "mps": "string", "units_total": "number",
		"units_free": "number", "units_reserved": "number", "gpus": "array",
	}
	checkFields(t, "snapshot", s, want)
	if s["schema"] != "gpulet.snapshot/v1" || s["node"] != "e2e" || s["state"] != "working" || s["backend"] != "simulated" {
		t.Fatalf("snapshot header %v", s)
	}
	if _, err := time.Parse(time.RFC3339Nano, s["time"].(string)); err != nil {
		t.Fatalf("time %q: %v", s["time"], err)
	}
	if s["units_total"].(float64) != 48 || s["units_free"].(float64) != 48 || s["units_reserved"].(float64) != 0 {
		t.Fatalf("totals %v %v %v", s["units_total"], s["units_free"], s["units_reserved"])
	}
	gpus := s["gpus"].([]any)
	if len(gpus) != 3 {
		t.Fatalf("%d GPUs", len(gpus))
	}
	gpuFields := map[string]string{
		"index": "number", "uuid": "string", "name": "string", "state": "string", "eligible": "bool",
		"units_total": "number", "units_used": "number", "units_free": "number", "units_offline": "number",
		"units_reserved": "number", "utilization_pct": "number", "max_utilization_pct": "number",
		"utilization_source": "string", "kernel_time_pct": "number", "outside_memory_mib": "number",
		"memory_total_mib": "number", "memory_used_mib": "number", "memory_held_mib": "number", "instances": "array",
	}
	names := []string{"NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "Tesla T4"}
	for i, gv := range gpus {
		g := gv.(map[string]any)
		checkFields(t, "gpu", g, gpuFields)
		if g["index"].(float64) != float64(i) || g["name"] != names[i] || !strings.HasPrefix(g["uuid"].(string), "GPU-") ||
			g["state"] != "working" || g["eligible"] != true || g["units_total"].(float64) != 16 || g["max_utilization_pct"].(float64) != 90 {
			t.Fatalf("gpu %d: %v", i, g)
		}
		inst := g["instances"].([]any)
		if len(inst) != 1 {
			t.Fatalf("gpu %d instances %v", i, inst)
		}
		checkFields(t, "instance", inst[0].(map[string]any), map[string]string{"instance": "number", "state": "string", "clients": "number", "clients_max": "number"})
	}
	// A new snapshot, and a higher seq, come with a change only: an idle
	// node keeps its seq across sample ticks (100ms here). Three pings after
	// the first read are at least two whole ticks after it.
	a, _ := d.Client.Snapshot(e2e.Ctx(t))
	waitWatchdog(t, notify, 3)
	b, _ := d.Client.Snapshot(e2e.Ctx(t))
	if a.BootID != b.BootID || b.Seq != a.Seq {
		t.Fatalf("idle node: seq %d then %d (boot %s, %s)", a.Seq, b.Seq, a.BootID, b.BootID)
	}
	if _, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"}); err != nil {
		t.Fatal(err)
	}
	leased, _ := d.Client.Snapshot(e2e.Ctx(t))
	if leased.BootID != b.BootID || leased.Seq <= b.Seq {
		t.Fatalf("after a lease: seq %d then %d", b.Seq, leased.Seq)
	}
	// UUIDs are stable across restarts; boot_id is not.
	d.Stop()
	d.Restart()
	c, _ := d.Client.Snapshot(e2e.Ctx(t))
	if c.GPUs[2].UUID != gpus[2].(map[string]any)["uuid"] || c.BootID == a.BootID {
		t.Fatalf("after restart: uuid %s boot %s", c.GPUs[2].UUID, c.BootID)
	}
}

// listenNotify makes a notify socket, as systemd's, that the gpuletd the
// test starts next writes to.
func listenNotify(t *testing.T) *net.UnixConn {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return c
}

// waitWatchdog drops the notifications already there, then waits for n
// watchdog pings: all of them were sent after the call began.
func waitWatchdog(t *testing.T, c *net.UnixConn, n int) {
	t.Helper()
	buf := make([]byte, 4096)
	for {
		// A deadline already past fails a read even with data waiting.
		c.SetReadDeadline(time.Now().Add(time.Millisecond))
		if _, err := c.Read(buf); err != nil {
			break
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for n > 0 {
		c.SetReadDeadline(deadline)
		got, err := c.Read(buf)
		if err != nil {
			t.Fatalf("waiting for %d more watchdog pings: %v", n, err)
		}
		if slices.Contains(strings.Split(string(buf[:got]), "\n"), "WATCHDOG=1") {
			n--
		}
	}
}

func checkFields(t *testing.T, what string, m map[string]any, want map[string]string) {
	t.Helper()
	for k, typ := range want {
		v, ok := m[k]
		if !ok {
			t.Fatalf("%s lacks %q: %v", what, k, m)
		}
		var got string
		switch v.(type) {
		case string:
			got = "string"
		case float64:
			got = "number"
		case bool:
			got = "bool"
		case []any:
			got = "array"
		default:
			got = "other"
		}
		if got != typ {
			t.Fatalf("%s.%s is %s, want %s", what, k, got, typ)
		}
	}
}

func TestGPUsAndMetrics(t *testing.T) {
	d := e2e.Start(t)
	l, err := d.Client.GPUs(e2e.Ctx(t))
	if err != nil || l.Backend != "simulated" || len(l.GPUs) != 2 || l.GPUs[0].MemoryTotalMiB != 81920 {
		t.Fatalf("gpus %+v %v", l, err)
	}
	m, err := d.Client.Metrics(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"gpulet_units{", "gpulet_units_used{", "gpulet_units_free{", "gpulet_units_offline{",
		"gpulet_gpu_utilization_percent{", "gpulet_gpu_memory_used_bytes{", `gpulet_gpu_state{gpu="0"`, "gpulet_node_info{"} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestSocketModeAndSecondDaemon(t *testing.T) {
	d := e2e.Start(t)
	fi, err := os.Stat(d.Socket)
	if err != nil || fi.Mode().Perm() != 0o660 || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket mode %v %v", fi.Mode(), err)
	}
	out, err := exec.Command(e2e.Bin("gpuletd"), d.Args...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), fmt.Sprintf("another gpuletd (pid %d) is already running with --run-dir", d.Pid())) {
		t.Fatalf("second daemon: %v\n%s", err, out)
	}
	// Another run dir, the same socket.
	args := append(append([]string{}, d.Args...), "--run-dir", t.TempDir())
	out, err = exec.Command(e2e.Bin("gpuletd"), args...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another gpuletd is already serving") {
		t.Fatalf("second daemon on the same socket: %v\n%s", err, out)
	}
	// The first one still serves.
	if _, err := d.Client.Snapshot(e2e.Ctx(t)); err != nil {
		t.Fatal(err)
	}
}

func TestStaleSocketIsReplacedAndSIGTERMStopsCleanly(t *testing.T) {
	d := e2e.Start(t)
	d.Kill9()
	if _, err := os.Stat(d.Socket); err != nil {
		t.Fatal("kill -9 left no socket file to test with")
	}
	d.Restart()
	if err := d.Stop(); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, d.Log.String())
	}
	if _, err := os.Stat(d.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after a clean stop: %v", err)
	}
}

func TestBadFlagsFailClearly(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--units-per-client", "1", "--units-per-gpu", "20"}, "20 is more than M×N×K"},
		{[]string{"--sim-gpus", "2xRTX"}, "unknown model"},
		{[]string{"--backend", "opencl"}, `gpuletd: --backend "opencl": must be auto, nvml or sim` + "\n"},
		{[]string{"--mps", "yes"}, `gpuletd: --mps "yes": want on, off or auto` + "\n"},
		{[]string{"--policy", "random"}, `gpuletd: --policy "random": must be one of`},
	} {
		cmd := exec.Command(e2e.Bin("gpuletd"), tc.args...)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), tc.msg) || stdout.Len() != 0 {
			t.Errorf("gpuletd %v: %v, stdout %q, stderr %q", tc.args, err, stdout.String(), stderr.String())
		}
		if lines := strings.Count(stderr.String(), "\n"); lines != 1 {
			t.Errorf("gpuletd %v: %d lines on stderr, want the error alone: %q", tc.args, lines, stderr.String())
		}
	}
	// Help asked for goes to stdout, grouped, and exits 0.
	for _, arg := range []string{"--help", "-h"} {
		cmd := exec.Command(e2e.Bin("gpuletd"), arg)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil || stderr.Len() != 0 || !strings.Contains(stdout.String(), "\nUnits (M×N×K, U):\n  --units-per-client int ") {
			t.Errorf("gpuletd %s: %v, stdout %q, stderr %q", arg, err, stdout.String(), stderr.String())
		}
	}
}

func TestSimControlEndpoint(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("the simulated GPU control is root-only and this test runs as uid", os.Getuid())
	}
	d := e2e.Start(t)
	u := 95
	g, err := d.Client.SetSimGPU(e2e.Ctx(t), 0, api.SimGPUUpdate{UtilizationPct: &u})
	if err != nil || g.UtilizationPct != 95 || g.Eligible {
		t.Fatalf("after utilization 95: %+v %v", g, err)
	}
	// The busy GPU takes no new lease; the other does.
	l, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"})
	if err != nil || l.GPU.Index != 1 {
		t.Fatalf("lease on busy node: %+v %v", l, err)
	}
	_, err = d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, GPU: "0", TTL: "1m"})
	if !errors.Is(err, client.ErrInsufficientUnits) || !strings.Contains(err.Error(), "95% of its SMs busy") {
		t.Fatalf("lease on the busy GPU: %v", err)
	}
	st := "failed"
	g, err = d.Client.SetSimGPU(e2e.Ctx(t), 1, api.SimGPUUpdate{State: &st})
	if err != nil || g.State != "failed" || g.Eligible {
		t.Fatalf("after state failed: %+v %v", g, err)
	}
	if _, err := d.Client.SetSimGPU(e2e.Ctx(t), 9, api.SimGPUUpdate{State: &st}); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("unknown GPU: %v", err)
	}
}

func TestRawHTTPErrors(t *testing.T) {
	// M=1: a request for two units is one more than a process may hold.
	d := e2e.Start(t, "--units-per-client", "1")
	hc := &http.Client{Transport: testutil.UnixTransport(d.Socket)}
	for _, tc := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"GET", "/v1/none", "", 404, "not_found"},
		{"DELETE", "/v1/snapshot", "", 405, "method_not_allowed"},
		{"POST", "/v1/leases", `{"units":1,"x":2}`, 400, "bad_request"},
		{"POST", "/v1/leases", `{"units":"one"}`, 400, "bad_request"},
		{"POST", "/v1/leases", `{"units":2}`, 400, "bad_request"},
		{"POST", "/v1/leases", `{"units":1,"ttl":"forever"}`, 400, "bad_request"},
		{"POST", "/v1/leases", `{"units":1,"gpu":"5","ttl":"1m"}`, 400, "bad_request"},
		{"POST", "/v1/leases", strings.Repeat(" ", 2<<20), 413, "request_too_large"},
	} {
		req, _ := http.NewRequest(tc.method, "http://gpulet"+tc.path, strings.NewReader(tc.body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var eb api.ErrorBody
		if resp.StatusCode != tc.status || json.Unmarshal(b, &eb) != nil || eb.Error.Code != tc.code || eb.Error.Message == "" {
			t.Errorf("%s %s %.40q: %d %s", tc.method, tc.path, tc.body, resp.StatusCode, b)
		}
	}
	s, _ := d.Client.Snapshot(e2e.Ctx(t))
	if s.UnitsFree != s.UnitsTotal {
		t.Fatalf("bad requests changed state: %d of %d free", s.UnitsFree, s.UnitsTotal)
	}
}

// readLine reads one line from a helper process's stdout.
func readLine(t *testing.T, r io.Reader) string {
	t.Helper()
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		t.Fatalf("reading helper output: %v", err)
	}
	return strings.TrimSpace(line)
}
