package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
)

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{nil, ExitUsage, "Commands:"},
		{[]string{"bogus"}, ExitUsage, `unknown command "bogus"`},
		{[]string{"release"}, ExitUsage, "want 1 argument"},
		{[]string{"status", "--bogus"}, ExitUsage, "unknown flag"},
		{[]string{"--help"}, ExitOK, "Commands:"},
		{[]string{"status", "--help"}, ExitOK, "--json"},
		{[]string{"--socket", "/nonexistent/s", "status"}, ExitFailure, "cannot reach gpuletd at /nonexistent/s"},
	} {
		var out, errb bytes.Buffer
		code := Main(tc.args, &out, &errb)
		if code != tc.code || !strings.Contains(out.String()+errb.String(), tc.msg) {
			t.Errorf("gpulet %v: exit %d, output %q; want %d containing %q", tc.args, code, out.String()+errb.String(), tc.code, tc.msg)
		}
	}
}

func FuzzMainArgs(f *testing.F) {
	for _, s := range []string{"status", "leases --all", "release x y", "top --interval 1ns", "--socket", "drain extra"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		args := append([]string{"--socket", "/nonexistent/gpulet.sock"}, strings.Fields(line)...)
		var out, errb bytes.Buffer
		if code := Main(args, &out, &errb); code != ExitOK && errb.Len() == 0 {
			t.Fatalf("gpulet %q failed (%d) without saying why", line, code)
		}
	})
}

func TestStatusTable(t *testing.T) {
	uid := uint32(1000)
	s := &api.Snapshot{Node: "n1", State: "working", Backend: api.BackendSimulated, MPS: "on", UnitsTotal: 16, UnitsFree: 11,
		GPUs: []api.GPU{{Index: 0, Name: "Tesla T4", State: "working", Eligible: true, UnitsTotal: 16, UnitsUsed: 5, UnitsOffline: 2, UnitsFree: 11,
			UtilizationPct: 37, MemoryUsedMiB: 100, MemoryTotalMiB: 15360, Instances: []api.Instance{{Instance: 0, State: "running", UID: &uid}}}}}
	var b bytes.Buffer
	WriteStatus(&b, s)
	for _, want := range []string{"backend: simulated", "[###oo...........]", "5/2/11", "37%", "100/15360", "0:running uid 1000", "total: 16 units, 11 free"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
}
