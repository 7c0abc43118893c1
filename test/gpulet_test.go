package test

import (
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/e2e"
)

// gpulet runs the real gpulet against d.
func gpulet(t *testing.T, d *e2e.Daemon, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(e2e.Bin("gpulet"), append([]string{"--socket", d.Socket}, args...)...).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

func TestGpuletCommands(t *testing.T) {
	d := e2e.Start(t, "--sim-gpus", "1xA100-80GB,1xT4")
	l, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, GPU: "1", TTL: "5m", Task: "train"})
	if err != nil {
		t.Fatal(err)
	}
	out, code := gpulet(t, d, "status")
	for _, want := range []string{"backend: simulated", "NVIDIA A100-SXM4-80GB", "Tesla T4", "[#...............]", "1/0/15", "total: 32 units, 31 free"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("status lacks %q (exit %d):\n%s", want, code, out)
		}
	}
	out, code = gpulet(t, d, "status", "--json")
	var s api.Snapshot
	if code != 0 || json.Unmarshal([]byte(out), &s) != nil || s.Schema != api.SnapshotSchema || s.UnitsFree != 31 {
		t.Fatalf("status --json (exit %d): %s", code, out)
	}
	out, code = gpulet(t, d, "leases")
	if code != 0 || !strings.Contains(out, l.ID) || !strings.Contains(out, "train") {
		t.Fatalf("leases (exit %d):\n%s", code, out)
	}
	out, code = gpulet(t, d, "release", "l-0000000000000000")
	if code != 1 || !strings.Contains(out, "gpulet: not_found: ") {
		t.Fatalf("release of a missing lease (exit %d): %s", code, out)
	}
	if out, code = gpulet(t, d, "release", l.ID); code != 0 || !strings.Contains(out, "released "+l.ID) {
		t.Fatalf("release (exit %d): %s", code, out)
	}
	if out, code = gpulet(t, d, "drain"); code != 0 || !strings.Contains(out, "draining") {
		t.Fatalf("drain (exit %d): %s", code, out)
	}
	if _, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"}); err == nil || !strings.Contains(err.Error(), "draining") {
		t.Fatalf("lease on a draining node: %v", err)
	}
	if out, _ := gpulet(t, d, "status"); !strings.Contains(out, "state: draining") {
		t.Fatalf("status while draining:\n%s", out)
	}
	if out, code = gpulet(t, d, "undrain"); code != 0 || !strings.Contains(out, "working") {
		t.Fatalf("undrain (exit %d): %s", code, out)
	}
	if _, code = gpulet(t, d, "frobnicate"); code != 2 {
		t.Fatalf("unknown command exit %d, want 2", code)
	}
}
