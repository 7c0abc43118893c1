package test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// policyNode is a mixed simulated node: GPU 0 a T4, GPU 1 an A100, four
// units each, two per process.
var policyNode = []string{"--sim-gpus", "1xT4-16GB,1xA100-80GB", "--units-per-client", "2", "--clients-per-instance", "2", "--units-per-gpu", "4"}

func writeConfigFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// asUser runs a gpulet binary as u against d and returns its output and exit
// code.
func asUser(t *testing.T, d *e2e.Daemon, u testUser, bin string, args ...string) (string, int) {
	t.Helper()
	cmd := u.command(copyForOthers(t, e2e.Bin(bin)), append([]string{"--socket", d.Socket}, args...)...)
	return e2e.Output(t, cmd)
}

// TestPoolsQuotasAndReload drives pools, permissions and quotas with real
// users and groups, then reloads the config with SIGHUP: a good file takes
// effect, a bad one is logged and changes nothing.
func TestPoolsQuotasAndReload(t *testing.T) {
	needUserTools(t)
	sockGroup, ml := addGroup(t), addGroup(t)
	alice := addUser(t, sockGroup, ml)
	bob := addUser(t, sockGroup)
	conf := filepath.Join(t.TempDir(), "gpulet.yaml")
	writeConfigFile(t, conf, fmt.Sprintf(`pools:
  training:
    gpus: ["1"]
    users: [%q]
quotas:
  %s: 2
  "group:%s": 3
`, "group:"+ml, alice.name, ml))
	d := startForUsers(t, sockGroup, append(policyNode, "--config", conf)...)

	// bob may not use the pool, nor lease on its GPU without naming it.
	out, code := asUser(t, d, bob, "gpurun", "--pool", "training", "--", "true")
	if code != 125 || !strings.Contains(out, "forbidden") || !strings.Contains(out, fmt.Sprintf("pool training: %s (uid %d) may not lease there", bob.name, bob.uid)) {
		t.Fatalf("bob in pool training: exit %d\n%s", code, out)
	}
	out, code = asUser(t, d, bob, "gpurun", "--dry-run", "--type", "A100")
	if code != 125 || !strings.Contains(out, "only in pools you may not use (training)") || !strings.Contains(out, api.NeverFits) {
		t.Fatalf("bob on the A100: exit %d\n%s", code, out)
	}
	out, code = asUser(t, d, bob, "gpurun", "--pool", "nope", "--", "true")
	if code != 125 || !strings.Contains(out, "not_found") {
		t.Fatalf("unknown pool: exit %d\n%s", code, out)
	}
	// alice may, through her group: a dry run says where, then a real lease.
	out, code = asUser(t, d, alice, "gpurun", "--dry-run", "--pool", "training")
	if code != 0 || !strings.Contains(out, "would go to GPU 1") || !strings.Contains(out, "GPU 0: left out: is not in pool training") {
		t.Fatalf("alice's dry run: exit %d\n%s", code, out)
	}
	holder := alice.command(copyForOthers(t, e2e.Bin("gpurun")), "--socket", d.Socket, "--units", "2", "--pool", "training", "--", "sleep", "300")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	testutil.Eventually(t, "alice's lease", func() bool {
		ls, err := d.Client.Leases(e2e.Ctx(t))
		return err == nil && len(ls) == 1
	})
	// Her own quota (2) is used up: quota_exceeded, naming it.
	out, code = asUser(t, d, alice, "gpurun", "--", "true")
	if code != 125 || !strings.Contains(out, "quota_exceeded") || !strings.Contains(out, "quota "+alice.name+": limit 2 unit(s), you hold 2, 1 more asked") {
		t.Fatalf("alice over her quota: exit %d\n%s", code, out)
	}
	out, code = asUser(t, d, alice, "gpulet", "status")
	if code != 0 || !strings.Contains(out, "training") || !strings.Contains(out, "may use") ||
		!strings.Contains(out, alice.name+" 2/2") || !strings.Contains(out, "group:"+ml+" 2/3") {
		t.Fatalf("alice's status: exit %d\n%s", code, out)
	}
	// root is bound by no quota.
	if _, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 2, TTL: "1m"}); err != nil {
		t.Fatal(err)
	}

	// A reload that lifts alice's quota lets her lease again.
	writeConfigFile(t, conf, fmt.Sprintf("quotas:\n  %s: 4\n", alice.name))
	syscall.Kill(d.Pid(), syscall.SIGHUP)
	testutil.Eventually(t, "the reload to be logged", func() bool { return strings.Contains(d.Log.String(), "config reloaded") })
	out, code = asUser(t, d, alice, "gpurun", "--dry-run")
	if code != 0 {
		t.Fatalf("alice after the reload: exit %d\n%s", code, out)
	}
	// A bad file is logged with its line, and the config in force stays.
	writeConfigFile(t, conf, fmt.Sprintf("quotas:\n  %s: -1\n", alice.name))
	syscall.Kill(d.Pid(), syscall.SIGHUP)
	testutil.Eventually(t, "the bad reload to be logged", func() bool { return strings.Contains(d.Log.String(), "config not reloaded") })
	if !strings.Contains(d.Log.String(), "line 2") {
		t.Fatalf("the refusal does not name the line:\n%s", d.Log.String())
	}
	out, code = asUser(t, d, alice, "gpulet", "status")
	if code != 0 || !strings.Contains(out, alice.name+" 2/4") {
		t.Fatalf("alice's status after a bad reload: exit %d\n%s", code, out)
	}
	// The failure is in the snapshot and gpulet status too, not the log alone.
	want := "config: the reload of " + conf + " at "
	if !strings.Contains(out, want) || !strings.Contains(out, "failed, and the config read before stays in force: ") || !strings.Contains(out, "line 2") {
		t.Fatalf("alice's status after a bad reload lacks %q…:\n%s", want, out)
	}
	// A good reload clears it.
	writeConfigFile(t, conf, fmt.Sprintf("quotas:\n  %s: 4\n", alice.name))
	syscall.Kill(d.Pid(), syscall.SIGHUP)
	testutil.Eventually(t, "the config_error to clear", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.ConfigError == ""
	})
}

// TestBadConfigStopsTheStart: a config that does not hold is refused at
// start, naming the file and the line.
func TestBadConfigStopsTheStart(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "gpulet.yaml")
	writeConfigFile(t, conf, "pools:\n  p:\n    gpus: [\"7\"]\n")
	dir := t.TempDir()
	cmd := exec.Command(e2e.Bin("gpuletd"), "--socket", filepath.Join(dir, "s"), "--run-dir", filepath.Join(dir, "run"), "--state-dir", filepath.Join(dir, "state"),
		"--mount", "", "--backend", "sim", "--mps", "off", "--config", conf)
	out, code := e2e.Output(t, cmd)
	if code == 0 || !strings.Contains(out, conf) || !strings.Contains(out, "line 3") {
		t.Fatalf("exit %d\n%s", code, out)
	}
}

// TestTaskAffinityLearns: a task goes to its fastest model, falls back to
// the next when that one is full, and a run measured by the daemon enters
// the table and survives a restart.
func TestTaskAffinityLearns(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "gpulet.yaml")
	writeConfigFile(t, conf, `profiles:
  resnet50:
    "NVIDIA A100-SXM4-80GB": 95s
    "Tesla T4": 410s
`)
	d := e2e.Start(t, append(policyNode, "--config", conf, "--policy", "first-fit")...)
	ctx := e2e.Ctx(t)
	p, err := d.Client.Place(ctx, api.LeaseRequest{Units: 1, Task: "resnet50"})
	if err != nil || p.GPU.Index != 1 {
		t.Fatalf("resnet50 dry run: %+v, %v; want the A100 (GPU 1)", p, err)
	}
	// Fill the A100: the task falls back to the T4 rather than failing.
	for i := 0; i < 2; i++ {
		if _, err := d.Client.Lease(ctx, api.LeaseRequest{Units: 2, GPU: "1", TTL: "1m"}); err != nil {
			t.Fatal(err)
		}
	}
	if p, err = d.Client.Place(ctx, api.LeaseRequest{Units: 1, Task: "resnet50"}); err != nil || p.GPU.Index != 0 {
		t.Fatalf("resnet50 with the A100 full: %+v, %v; want the T4", p, err)
	}
	// A run measured by the daemon: a task lease whose process exits.
	run := exec.Command(e2e.Bin("gpurun"), "--socket", d.Socket, "--task", "tiny", "--", "sleep", "0.3")
	if out, code := e2e.Output(t, run); code != 0 {
		t.Fatalf("gpurun: exit %d\n%s", code, out)
	}
	var profiles *api.ProfileList
	testutil.Eventually(t, "the run to enter the table", func() bool {
		profiles, err = d.Client.Profiles(ctx)
		return err == nil && len(profiles.Profiles) == 2
	})
	tiny := profiles.Profiles[1]
	if tiny.Task != "tiny" || len(tiny.Models) != 1 || tiny.Models[0].Model != "Tesla T4" || tiny.Models[0].Runs != 1 || tiny.Models[0].Seconds < 0.3 {
		t.Fatalf("tiny's profile %+v", tiny)
	}
	if profiles.Profiles[0].Models[0].Runs != 0 {
		t.Fatalf("a config figure counts runs: %+v", profiles.Profiles[0])
	}
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	d.Restart()
	out, code := e2e.Output(t, exec.Command(e2e.Bin("gpulet"), "--socket", d.Socket, "profiles"))
	if code != 0 || !strings.Contains(out, "tiny") || !strings.Contains(out, "resnet50") {
		t.Fatalf("gpulet profiles after a restart: exit %d\n%s", code, out)
	}
	b, _ := json.Marshal(profiles)
	t.Logf("profiles: %s", b)
}

// TestDryRunChangesNothing: POST /v1/placements answers where a lease would
// go, or the error it would get, and leases nothing.
func TestDryRunChangesNothing(t *testing.T) {
	e2e.RequireRoot(t, "it makes a simulated GPU busy through the simulated GPU controls, which are root's")
	d := e2e.Start(t, policyNode...)
	ctx := e2e.Ctx(t)
	busy := 95
	if _, err := d.Client.SetSimGPU(ctx, 1, api.SimGPUUpdate{UtilizationPct: &busy}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the A100 to be too busy", func() bool {
		s, err := d.Client.Snapshot(ctx)
		return err == nil && !s.GPUs[1].Eligible
	})
	p, err := d.Client.Place(ctx, api.LeaseRequest{Units: 1})
	if err != nil || p.GPU.Index != 0 || len(p.Candidates) != 2 || p.Candidates[1].Kept || !strings.Contains(p.Candidates[1].Why, "busy") {
		t.Fatalf("dry run %+v, %v", p, err)
	}
	_, err = d.Client.Place(ctx, api.LeaseRequest{Units: 1, Type: "H100"})
	if !errors.Is(err, client.ErrInsufficientUnits) || !strings.Contains(err.Error(), api.NeverFits) {
		t.Fatalf("dry run of a type the node lacks: %v", err)
	}
	if ls, _ := d.Client.Leases(ctx); len(ls) != 0 {
		t.Fatalf("a dry run leased: %+v", ls)
	}
	// gpurun --dry-run prints the same, and runs nothing.
	marker := filepath.Join(t.TempDir(), "ran")
	out, code := e2e.Output(t, exec.Command(e2e.Bin("gpurun"), "--socket", d.Socket, "--dry-run", "--", "touch", marker))
	if code != 0 || !strings.Contains(out, "would go to GPU 0") || !strings.Contains(out, "GPU 1: left out") {
		t.Fatalf("gpurun --dry-run: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("gpurun --dry-run ran the command")
	}
}
