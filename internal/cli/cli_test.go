package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
)

// fakeDaemon serves a fixed snapshot and lease list, and answers DELETE of an
// unknown lease with not_found.
func fakeDaemon(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	uid := uint32(os.Getuid())
	leases := api.LeaseList{Leases: []api.Lease{
		{ID: "l-mine", GPU: api.LeaseGPU{Index: 1}, Units: []int{4, 5, 6}, Owner: api.Owner{UID: uid, PID: 42}, Task: "train"},
		{ID: "l-other", GPU: api.LeaseGPU{Index: 0}, Units: []int{0}, Owner: api.Owner{UID: uid + 1, PID: 43}},
	}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/v1/snapshot":
			w.Write([]byte(`{"schema":"gpulet.snapshot/v1","node":"n1","state":"working","backend":"simulated","units_total":16,"units_free":16,"gpus":[]}` + "\n"))
		case r.URL.Path == "/v1/gpus":
			json.NewEncoder(w).Encode(api.GPUList{Backend: api.BackendSimulated, GPUs: []api.GPU{
				{Index: 0, UUID: "GPU-a", Name: "Tesla T4", State: "working", UnitsTotal: 16, UnitsFree: 12, MemoryTotalMiB: 15360,
					Capability: api.Capability{ComputeCapability: "7.5", MaxSMClockMHz: 1590, MemoryBandwidthGBps: 320}},
				{Index: 1, UUID: "GPU-b", Name: "NVIDIA A100-SXM4-80GB", State: "failed", UnitsTotal: 16, MemoryTotalMiB: 81920,
					Capability: api.Capability{ComputeCapability: "8.0", MaxSMClockMHz: 1410, MemoryBandwidthGBps: 2039}},
			}})
		case r.URL.Path == "/v1/leases":
			json.NewEncoder(w).Encode(leases)
		case r.URL.Path == "/v1/pools":
			w.Write([]byte(`{"pools":[]}` + "\n"))
		case r.URL.Path == "/v1/quotas":
			w.Write([]byte(`{"admin":false,"quotas":[]}` + "\n"))
		case r.Method == "DELETE" && r.URL.Path == "/v1/leases/l-mine":
			w.WriteHeader(http.StatusNoContent)
		case r.URL.Path == "/v1/node/undrain":
			var req api.UndrainRequest
			json.NewDecoder(r.Body).Decode(&req)
			s := api.Snapshot{Node: "n1", State: "draining", GPUs: []api.GPU{
				{Index: 0, UUID: "GPU-a", State: "working", Eligible: true},
				{Index: 1, UUID: "GPU-b", State: "failed", Error: "NVML utilization: GPU is lost"},
			}}
			if req.GPU == "" {
				s.State = "working"
			}
			json.NewEncoder(w).Encode(s)
		case r.URL.Path == "/v1/node/drain":
			w.WriteHeader(http.StatusForbidden)
			json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorDetail{Code: api.CodeForbidden, Message: "draining the node is for root and the admin group"}})
		default:
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorDetail{Code: api.CodeNotFound, Message: "no lease \"" + filepath.Base(r.URL.Path) + "\""}})
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

func TestRun(t *testing.T) {
	sock := fakeDaemon(t)
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"no command", nil, ExitUsage, "", "Commands:"},
		{"unknown command", []string{"bogus"}, ExitUsage, "", "gpulet: unknown command \"bogus\"\nRun 'gpulet help' for usage.\n"},
		{"release without id", []string{"release"}, ExitUsage, "", "release: wrong number of arguments: gpulet release ID..."},
		{"a command's usage error points at its help", []string{"status", "x"}, ExitUsage, "", "\nRun 'gpulet help status' for usage.\n"},
		{"status with an argument", []string{"status", "x"}, ExitUsage, "", "wrong number of arguments"},
		{"unknown flag", []string{"status", "--bogus"}, ExitUsage, "", "unknown flag: --bogus"},
		{"unknown global flag", []string{"--bogus", "status"}, ExitUsage, "", "unknown flag: --bogus"},
		{"help flag", []string{"--help"}, ExitOK, "Commands:", ""},
		{"help command", []string{"help"}, ExitOK, "Examples:", ""},
		{"help lists config check", []string{"help"}, ExitOK, "  config check FILE ", ""},
		{"help of a command", []string{"help", "leases"}, ExitOK, "Usage: gpulet leases [--all] [--json]", ""},
		{"help of a bogus command", []string{"help", "bogus"}, ExitUsage, "", `help: no command "bogus"`},
		{"command help", []string{"status", "--help"}, ExitOK, "--json", ""},
		{"short interval", []string{"--socket", sock, "top", "--interval", "1ms"}, ExitUsage, "", "gpulet: top: --interval 1ms is too short (at least 100ms)\nRun 'gpulet help top' for usage.\n"},
		{"no daemon", []string{"--socket", "/nonexistent/s", "status"}, ExitFailure, "", "gpulet: cannot reach gpuletd at /nonexistent/s: is it running?"},
		{"no daemon says what to do", []string{"--socket", "/nonexistent/s", "leases"}, ExitFailure, "", "\n  start gpuletd (systemctl start gpuletd), or point --socket or GPULET_SOCKET at its socket\n"},
		{"status --json is the daemon's bytes", []string{"--socket", sock, "status", "--json"}, ExitOK,
			`{"schema":"gpulet.snapshot/v1","node":"n1","state":"working","backend":"simulated","units_total":16,"units_free":16,"gpus":[]}` + "\n", ""},
		{"socket after the command", []string{"status", "--socket", sock}, ExitOK, "backend: simulated (no real GPU)", ""},
		{"gpus", []string{"--socket", sock, "gpus"}, ExitOK, "0    Tesla T4               7.5  15360         320               1590            12/16       working\n1    NVIDIA A100-SXM4-80GB  8.0  81920         2039              1410            0/16        failed\n", ""},
		{"gpus --json", []string{"--socket", sock, "gpus", "--json"}, ExitOK, `"memory_bandwidth_gbps": 320`, ""},
		{"own leases", []string{"--socket", sock, "leases"}, ExitOK, "l-mine", "1 lease(s) of other users not shown; --all shows them"},
		{"all leases", []string{"--socket", sock, "leases", "--all"}, ExitOK, "l-other", ""},
		{"release", []string{"--socket", sock, "release", "l-mine"}, ExitOK, "released l-mine\n", ""},
		{"release unknown", []string{"--socket", sock, "release", "l-nope"}, ExitFailure, "", "gpulet: not_found: no lease \"l-nope\"\n"},
		{"release several", []string{"--socket", sock, "release", "l-nope", "l-mine"}, ExitFailure, "released l-mine", "gpulet: l-nope: not_found: no lease \"l-nope\"\ngpulet: 1 of 2 lease(s) not released\n"},
		{"undrain", []string{"--socket", sock, "undrain"}, ExitOK, "node n1 is working", ""},
		{"undrain a GPU", []string{"--socket", sock, "undrain", "--gpu", "0"}, ExitOK,
			"GPU 0 (GPU-a): no Xid fault now; state working, eligible yes\nnode n1 is still draining", ""},
		{"undrain a GPU by UUID", []string{"--socket", sock, "undrain", "--gpu", "gpu-a"}, ExitOK, "GPU 0 (GPU-a): no Xid fault now", ""},
		{"undrain a GPU still failed", []string{"--socket", sock, "undrain", "--gpu", "1"}, ExitFailure, "",
			"gpulet: GPU 1 (GPU-b) has no Xid fault now but is still failed: NVML utilization: GPU is lost\n"},
		{"undrain an empty GPU", []string{"--socket", sock, "undrain", "--gpu", ""}, ExitUsage, "", "--gpu is empty"},
		{"drain forbidden", []string{"--socket", sock, "drain"}, ExitFailure, "", "gpulet: forbidden: draining the node is for root and the admin group\n"},
		{"config without a subcommand", []string{"config"}, ExitUsage, "", "config: wrong number of arguments: gpulet config check FILE"},
		{"config with an unknown subcommand", []string{"config", "lint", "f.yaml"}, ExitUsage, "", "gpulet: config: no subcommand \"lint\": gpulet config check FILE\nRun 'gpulet help config' for usage.\n"},
		{"help of config", []string{"help", "config"}, ExitOK, "Usage: gpulet config check FILE", ""},
		{"config check of a missing file", []string{"--socket", sock, "config", "check", "/nonexistent/c.yaml"}, ExitFailure, "", "gpulet: /nonexistent/c.yaml: no such file or directory\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Run(context.Background(), tc.args, &out, &errb)
			if code != tc.code || !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errb.String(), tc.stderr) {
				t.Fatalf("gpulet %q: exit %d\nstdout %q\nstderr %q\nwant %d, %q, %q", tc.args, code, out.String(), errb.String(), tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}

func TestLeasesOnlyOwnWithoutAll(t *testing.T) {
	sock := fakeDaemon(t)
	var out bytes.Buffer
	if code := Run(context.Background(), []string{"--socket", sock, "leases", "--json"}, &out, &bytes.Buffer{}); code != 0 {
		t.Fatal(code)
	}
	var l api.LeaseList
	if err := json.Unmarshal(out.Bytes(), &l); err != nil || len(l.Leases) != 1 || l.Leases[0].ID != "l-mine" {
		t.Fatalf("leases --json: %s %v", out.String(), err)
	}
}

func TestTopEndsCleanlyOnSignal(t *testing.T) {
	sock := fakeDaemon(t)
	ctx, cancel := context.WithCancel(context.Background())
	out := &testutil.SyncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, []string{"--socket", sock, "top", "--interval", "100ms"}, out, &bytes.Buffer{})
	}()
	for strings.Count(out.String(), "backend: simulated") < 2 {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != ExitOK {
		t.Fatalf("top ended with %d", code)
	}
	if strings.Contains(out.String(), "\x1b[") {
		t.Fatal("top cleared a screen that is not a terminal")
	}
}

func TestStatusTable(t *testing.T) {
	uid := uint32(1000)
	s := &api.Snapshot{Node: "n1", State: "working", Backend: api.BackendSimulated, MPS: "on", UnitsTotal: 32, UnitsFree: 27,
		GPUs: []api.GPU{
			{Index: 0, Name: "Tesla T4", State: "working", Eligible: true, UnitsTotal: 16, UnitsUsed: 5, UnitsOffline: 2, UnitsFree: 11,
				UtilizationPct: 37, MaxUtilizationPct: 90, MemoryUsedMiB: 100, MemoryHeldMiB: 4800, MemoryTotalMiB: 15360, Instances: []api.Instance{{Instance: 0, State: "running", UID: &uid}}},
			{Index: 1, Name: "Tesla T4", State: "failed", Error: "Xid 79: GPU has fallen off the bus", Xid: 79, UnitsTotal: 16, UnitsFree: 16, MaxUtilizationPct: 90},
			{Index: 2, Name: "Tesla T4", State: "failed", Error: "NVML utilization: GPU is lost", UnitsTotal: 16, UnitsFree: 16, MaxUtilizationPct: 90},
		}}
	var b bytes.Buffer
	WriteStatus(&b, s)
	for _, want := range []string{
		"node n1  state: working  backend: simulated (no real GPU)  mps: on",
		"[###oo...........]", "LEASED/OFFLINE/RESERVED/FREE", "3/2/0/11", "37%", "MEMORY USED/HELD/TOTAL (MiB)", "100/4800/15360", "0:running uid 1000",
		"failed", "GPU 1: Xid 79: GPU has fallen off the bus (after a look at the GPU, an admin clears it: gpulet undrain --gpu 1)",
		"GPU 2: NVML utilization: GPU is lost\n",
		"total: 32 units, 27 free, 0 reserved   (# leased  o offline  r reserved  . free)",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
}

func TestStatusShowsUpstreams(t *testing.T) {
	at := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	s := &api.Snapshot{Node: "n1", State: api.NodeWorking, Upstreams: []api.UpstreamStatus{
		{URL: "http://a/x", LastSuccess: &at, LastSeq: 7, Pushes: 3},
		{URL: "https://b/y", Failures: 2, LastError: "HTTP 503: busy"},
	}}
	var b bytes.Buffer
	WriteStatus(&b, s)
	for _, want := range []string{
		"upstream http://a/x: last push 2026-11-23T12:00:00Z (seq 7), 3 in all\n",
		"upstream https://b/y: no push yet; failing (2 in a row): HTTP 503: busy\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
}

func TestStatusSaysWhyTheNodeIsDegraded(t *testing.T) {
	s := &api.Snapshot{Node: "n1", State: api.NodeDegraded, Reason: "cannot record leases (no space left on device)", Backend: api.BackendNVML, MPS: "off"}
	var b bytes.Buffer
	WriteStatus(&b, s)
	if want := "node degraded: cannot record leases (no space left on device)\n"; !strings.Contains(b.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, b.String())
	}
}

// A figure the driver did not give shows as -, not as a 0 that reads like a
// measurement.
func TestGPUsTableUnknownFigures(t *testing.T) {
	var b bytes.Buffer
	WriteGPUs(&b, &api.GPUList{GPUs: []api.GPU{
		{Index: 0, Name: "NVIDIA A100-SXM4-80GB", State: "working", UnitsTotal: 16, UnitsFree: 16, MemoryTotalMiB: 81920,
			Capability: api.Capability{ComputeCapability: "8.0", MaxSMClockMHz: 1410, MemoryBandwidthGBps: 2039}},
		{Index: 1, Name: "unknown", State: "failed", UnitsTotal: 16, Capability: api.Capability{ComputeCapability: "0.0"}},
	}})
	want := "GPU  NAME                   CC   MEMORY (MiB)  BANDWIDTH (GB/s)  SM CLOCK (MHz)  UNITS FREE  STATE\n" +
		"0    NVIDIA A100-SXM4-80GB  8.0  81920         2039              1410            16/16       working\n" +
		"1    unknown                -    0             -                 -               0/16        failed\n"
	if b.String() != want {
		t.Fatalf("gpus table:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestUnitBar(t *testing.T) {
	for _, tc := range []struct {
		name                          string
		used, offline, reserved, free int
		want                          string
	}{
		{"empty", 0, 0, 0, 16, "[................]"},
		{"mixed", 5, 2, 1, 8, "[###oor........]"},
		{"full", 4, 0, 0, 0, "[####]"},
		{"no units", 0, 0, 0, 0, "[]"},
		{"scaled", 128, 0, 0, 128, "[" + strings.Repeat("#", 32) + strings.Repeat(".", 32) + "]"},
		{"one offline of many shows", 1, 1, 0, 255, "[o" + strings.Repeat(".", 63) + "]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := api.GPU{UnitsUsed: tc.used, UnitsOffline: tc.offline, UnitsReserved: tc.reserved, UnitsFree: tc.free}
			if got := UnitBar(g); got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestWriteLeases(t *testing.T) {
	exp := time.Date(2026, 11, 22, 17, 0, 0, 0, time.Local)
	var b bytes.Buffer
	WriteLeases(&b, []api.Lease{
		{ID: "l-b", GPU: api.LeaseGPU{Index: 1}, Units: []int{0, 1, 2, 5}, Owner: api.Owner{UID: 7, PID: 99}, Expires: &exp},
		{ID: "l-a", GPU: api.LeaseGPU{Index: 0}, Units: []int{3}, Owner: api.Owner{UID: 0, PID: 12}, Task: "t", Preemptible: true},
		{ID: "l-c", GPU: api.LeaseGPU{Index: 2}, Units: []int{4}, Binding: "pod", Pod: &api.LeasePod{Namespace: "ml", Name: "train-0"}},
	})
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[3], "when pod ends") ||
		!strings.Contains(lines[3], "pod ml/train-0") || !strings.Contains(lines[3], " - ") ||
		!strings.Contains(lines[1], "l-a") || !strings.Contains(lines[1], "when pid exits") || !strings.Contains(lines[1], "t (preemptible)") ||
		!strings.Contains(lines[2], "0-2,5") || !strings.Contains(lines[2], "2026-11-22 17:00:00") || !strings.Contains(lines[2], " 99 ") {
		t.Fatalf("table:\n%s", b.String())
	}
	b.Reset()
	WriteLeases(&b, []api.Lease{{ID: "l-w", GPU: api.LeaseGPU{Index: 3}, GPUs: []api.LeaseGPU{{Index: 3}, {Index: 1}}, Units: []int{0, 1}, Owner: api.Owner{PID: 5}}})
	if row := strings.Fields(strings.Split(b.String(), "\n")[1]); row[1] != "3,1" || row[2] != "-" || row[3] != "all" {
		t.Fatalf("whole-GPU lease row: %q", row)
	}
	b.Reset()
	WriteLeases(&b, nil)
	if b.String() != "no leases\n" {
		t.Fatalf("empty: %q", b.String())
	}
}

func FuzzRunArgs(f *testing.F) {
	for _, s := range []string{"status", "leases --all", "release x y", "top --interval 1ns", "--socket", "drain extra", "help status", "status --json --socket", "-h", "undrain --gpu 0", "undrain --gpu", "config check /nonexistent", "config x y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		args := append([]string{"--socket", "/nonexistent/gpulet.sock"}, strings.Fields(line)...)
		var out, errb bytes.Buffer
		code := Run(context.Background(), args, &out, &errb)
		if code != ExitOK && errb.Len() == 0 {
			t.Fatalf("gpulet %q failed (%d) without saying why", line, code)
		}
		if code != ExitOK && code != ExitFailure && code != ExitUsage {
			t.Fatalf("gpulet %q: exit %d", line, code)
		}
	})
}

func TestConfigCheck(t *testing.T) {
	sock := fakeDaemon(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good := write("good.yaml", "pools:\n  p: {gpus: [0, GPU-b], users: [root, 'group:root']}\nquotas: {root: 4, '*': 8}\nprofiles: {t: {Tesla T4: 1s}}\n")
	gpu5 := write("gpu5.yaml", "pools:\n  p:\n    gpus: [5]\n")
	syntax := write("syntax.yaml", "quotas:\n  root: 4\n  x: -1\n")
	nobody := write("nobody.yaml", "quotas:\n  gpulet-no-such-user: 1\n")
	typo := write("typo.yaml", "profiles: {t: {Tesla-T4: 1s}}\n")
	const noDaemon = "/nonexistent/gpulet.sock"
	for _, tc := range []struct {
		name   string
		socket string
		file   string
		code   int
		stdout string
		stderr string
	}{
		{"good, against the daemon's GPUs", sock, good, ExitOK, good + ": ok (1 pool, 2 quotas, 1 task profile)\n", ""},
		{"a GPU the daemon lacks", sock, gpu5, ExitFailure, "", "gpulet: " + gpu5 + ": line 3: pools.p.gpus[0]: no GPU with index 5 (this node has 2)\n"},
		{"a GPU checked only for its form", noDaemon, gpu5, ExitOK, gpu5 + ": ok (1 pool, 0 quotas, 0 task profiles)\n",
			"gpulet: " + gpu5 + ": GPUs not checked against a node, only their form: cannot reach gpuletd at " + noDaemon + ": is it running?"},
		{"a profile model the node lacks", sock, typo, ExitOK, typo + ": ok (0 pools, 0 quotas, 1 task profile)\n",
			"gpulet: " + typo + `: warning: task profiles name GPU models this node has none of: "Tesla-T4" (its GPUs are named "NVIDIA A100-SXM4-80GB", "Tesla T4", as NVML names them)`},
		{"a bad quota", sock, syntax, ExitFailure, "", "gpulet: " + syntax + ": line 3: quotas.x: -1 is negative: a quota is 0 or more units\n"},
		{"bad file, no daemon needed", noDaemon, syntax, ExitFailure, "", "quotas.x: -1 is negative"},
		{"an unknown user without a daemon", noDaemon, nobody, ExitFailure, "", "gpulet: " + nobody + `: line 2: quotas.gpulet-no-such-user: no user "gpulet-no-such-user" on this machine` + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Run(context.Background(), []string{"--socket", tc.socket, "config", "check", tc.file}, &out, &errb)
			if code != tc.code || out.String() != tc.stdout || !strings.Contains(errb.String(), tc.stderr) {
				t.Fatalf("exit %d\nstdout %q\nstderr %q\nwant %d, %q, %q", code, out.String(), errb.String(), tc.code, tc.stdout, tc.stderr)
			}
			if tc.code == ExitFailure && strings.Count(errb.String(), "\n") != 1 && tc.socket == sock {
				t.Fatalf("more than one line: %q", errb.String())
			}
		})
	}
}

// TestConfigCheckDaemonHangs: a daemon that accepts but never answers costs
// the check its GPUs, not its answer.
func TestConfigCheckDaemonHangs(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the GPU query's timeout")
	}
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn
		for {
			c, err := ln.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	path := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(path, []byte("pools:\n  p: {gpus: [0]}\n"), 0o644)
	var out, errb bytes.Buffer
	code := Run(context.Background(), []string{"--socket", sock, "config", "check", path}, &out, &errb)
	if code != ExitOK || !strings.Contains(errb.String(), "gpuletd at "+sock+" did not answer within 5s") {
		t.Fatalf("exit %d\nstdout %q\nstderr %q", code, out.String(), errb.String())
	}
}

// The lease table names each lease's user and the command its process runs.
func TestWriteLeasesNamesUserAndCommand(t *testing.T) {
	var b bytes.Buffer
	WriteLeases(&b, []api.Lease{
		{ID: "l-a", Units: []int{0}, Owner: api.Owner{UID: 0, PID: os.Getpid()}},
		{ID: "l-b", Units: []int{1}, Owner: api.Owner{UID: 4294967294, PID: 0}, Binding: "ttl"},
	})
	lines := strings.Split(b.String(), "\n")
	if !strings.Contains(lines[0], " USER ") || !strings.Contains(lines[0], " COMMAND ") {
		t.Fatalf("header %q", lines[0])
	}
	self, err := os.ReadFile("/proc/self/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	cmd := strings.Fields(strings.ReplaceAll(string(self), "\x00", " "))[0]
	if row := strings.Fields(lines[1]); row[4] != "root" || row[6] != cmd[:min(len(cmd), maxCommand-1)] && !strings.HasPrefix(row[6], cmd[:maxCommand-1]) {
		t.Errorf("row of root's lease: %q, want user root and command %s", row, cmd)
	}
	if row := strings.Fields(lines[2]); row[4] != "4294967294" || row[6] != "-" {
		t.Errorf("row of a nameless uid without a process: %q", row)
	}
}

// Offline claims are listed after the leases, with their user and process.
func TestWriteClaims(t *testing.T) {
	var b bytes.Buffer
	WriteClaims(&b, &api.Snapshot{GPUs: []api.GPU{{Index: 1}}})
	if b.Len() != 0 {
		t.Fatalf("no claims printed %q", b.String())
	}
	WriteClaims(&b, &api.Snapshot{GPUs: []api.GPU{{Index: 0}, {Index: 1, Claims: []api.Claim{{Instance: 0, Units: []int{2, 3}, UID: 0, PID: os.Getpid()}, {Instance: 1, Units: []int{7}, UID: 4294967294}}}}})
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "offline claims") {
		t.Fatalf("claims:\n%s", b.String())
	}
	if row := strings.Fields(lines[2]); row[0] != "1" || row[2] != "2-3" || row[3] != "root" || row[4] != strconv.Itoa(os.Getpid()) || row[5] == "-" {
		t.Errorf("root's claim: %q", row)
	}
	if row := strings.Fields(lines[3]); row[3] != "4294967294" || row[4] != "-" || row[5] != "-" {
		t.Errorf("a claim of a nameless uid whose process is unknown: %q", row)
	}
}
