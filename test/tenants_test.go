package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// TestReloadOfAFIFOBlocksNothing: SIGHUP with the config path turned into a
// FIFO (which no one writes) is refused at once; the main loop goes on
// sweeping the ledger (an exited claimer's unit comes back) and a later
// good file reloads.
func TestReloadOfAFIFOBlocksNothing(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "gpulet.yaml")
	writeConfigFile(t, conf, "quotas:\n  \"*\": 8\n")
	d := e2e.Start(t, "--sim-gpus", "1xT4", "--clients-per-instance", "2", "--config", conf)
	claim := exec.Command(e2e.Bin("gpurun"), "--offline", "--", "sleep", "300")
	claim.Env = append(os.Environ(), "GPULET_RUN_DIR="+d.RunDir)
	if err := claim.Start(); err != nil {
		t.Fatal(err)
	}
	defer claim.Process.Kill()
	testutil.Eventually(t, "the offline claim counted", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.GPUs[0].UnitsOffline == 1
	})

	os.Remove(conf)
	if err := syscall.Mkfifo(conf, 0o644); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(d.Pid(), syscall.SIGHUP)
	testutil.Eventually(t, "the FIFO refused", func() bool {
		return strings.Contains(d.Log.String(), "not a regular file (a FIFO)")
	})
	claim.Process.Kill()
	claim.Wait()
	testutil.Eventually(t, "the exited claimer's unit freed by the sweep", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.GPUs[0].UnitsOffline == 0
	})

	os.Remove(conf)
	writeConfigFile(t, conf, "quotas:\n  \"*\": 3\n")
	syscall.Kill(d.Pid(), syscall.SIGHUP)
	testutil.Eventually(t, "the good file reloaded", func() bool {
		return strings.Contains(d.Log.String(), "SIGHUP: config reloaded")
	})
}

// TestConfigNamingADeletedUserStarts: a config naming a user deleted since
// does not stop gpuletd: the rule is skipped, logged and shown in gpulet
// status, while gpulet config check still reports it.
func TestConfigNamingADeletedUserStarts(t *testing.T) {
	needUserTools(t)
	gone := addUser(t)
	conf := filepath.Join(t.TempDir(), "gpulet.yaml")
	writeConfigFile(t, conf, fmt.Sprintf("pools:\n  p:\n    gpus: [\"0\"]\n    users: [root, %s]\nquotas:\n  %s: 2\n", gone.name, gone.name))
	if out, err := exec.Command("userdel", gone.name).CombinedOutput(); err != nil {
		t.Fatalf("userdel: %v\n%s", err, out)
	}
	d := e2e.Start(t, "--sim-gpus", "1xT4", "--config", conf)
	if !strings.Contains(d.Log.String(), "config rule skipped") {
		t.Fatalf("no warning logged:\n%s", d.Log.String())
	}
	out, code := e2e.Output(t, exec.Command(e2e.Bin("gpulet"), "--socket", d.Socket, "status"))
	for _, want := range []string{
		fmt.Sprintf(`line 4: pools.p.users[1]: no user %q on this machine; the pool's entry is skipped`, gone.name),
		fmt.Sprintf(`line 6: quotas.%s: no user %q on this machine; the quota is skipped`, gone.name, gone.name),
	} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("gpulet status: exit %d, want %q in\n%s", code, want, out)
		}
	}
	pools, err := d.Client.Pools(e2e.Ctx(t))
	if err != nil || len(pools.SkippedRules) != 2 {
		t.Fatalf("GET /v1/pools: %+v, %v", pools, err)
	}
	_, stderr, code := configCheck(t, d.Socket, conf)
	if code != 1 || !strings.Contains(stderr, fmt.Sprintf("no user %q on this machine", gone.name)) {
		t.Fatalf("gpulet config check: exit %d\n%s", code, stderr)
	}
}

// TestTaskProfilesArePerUser: one user's runs of a task teach only that
// user's placements; another user's follow the config's figures. Each sees
// only their own measured times, root sees all, and the file is private.
func TestTaskProfilesArePerUser(t *testing.T) {
	needUserTools(t)
	sockGroup := addGroup(t)
	mallory, alice := addUser(t, sockGroup), addUser(t, sockGroup)
	conf := filepath.Join(t.TempDir(), "gpulet.yaml")
	writeConfigFile(t, conf, "profiles:\n  resnet50:\n    \"NVIDIA A100-SXM4-80GB\": 95s\n    \"Tesla T4\": 410s\n")
	d := startForUsers(t, sockGroup, append(policyNode, "--config", conf, "--policy", "first-fit")...)
	// 410s·0.7^6 ≈ 48s: six quick runs put the T4 ahead of the A100's 95s.
	const runs = 6
	for range runs {
		if out, code := asUser(t, d, mallory, "gpurun", "--gpu", "0", "--task", "resnet50", "--", "true"); code != 0 {
			t.Fatalf("mallory's run: exit %d\n%s", code, out)
		}
	}
	testutil.Eventually(t, "mallory's runs measured", func() bool {
		p, err := d.Client.Profiles(e2e.Ctx(t))
		return err == nil && len(p.Learned) == 1 && p.Learned[0].UID == mallory.uid && p.Learned[0].Profiles[0].Models[0].Runs == runs
	})
	out, code := asUser(t, d, mallory, "gpurun", "--dry-run", "--task", "resnet50")
	if code != 0 || !strings.Contains(out, "would go to GPU 0") {
		t.Fatalf("mallory's own placement does not follow her runs: exit %d\n%s", code, out)
	}
	out, code = asUser(t, d, alice, "gpurun", "--dry-run", "--task", "resnet50")
	if code != 0 || !strings.Contains(out, "would go to GPU 1") {
		t.Fatalf("alice's placement follows mallory's runs: exit %d\n%s", code, out)
	}
	out, code = asUser(t, d, alice, "gpulet", "profiles", "--json")
	if code != 0 || strings.Contains(out, `"learned"`) || !strings.Contains(out, `"runs": 0`) || strings.Contains(out, fmt.Sprintf(`"runs": %d`, runs)) {
		t.Fatalf("alice's profiles show others' runs: exit %d\n%s", code, out)
	}
	out, code = asUser(t, d, mallory, "gpulet", "profiles")
	if code != 0 || !strings.Contains(out, fmt.Sprintf("Tesla T4               %s", "")) || !strings.Contains(out, fmt.Sprintf("  %d\n", runs)) {
		t.Fatalf("mallory's profiles: exit %d\n%s", code, out)
	}
	st, err := os.Stat(filepath.Join(d.Dir, "state", "profiles.json"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("profiles.json: %v, %v; want mode 0600", st, err)
	}
}

// TestOfflineClaimsKeepToPools: a GPU in a pool that names its users takes
// offline claims from those users only (and root): the ledger's folders of
// its GPU are closed to the rest of the socket group; a reload that names
// one user more lets that user in, and one without pools opens it again.
func TestOfflineClaimsKeepToPools(t *testing.T) {
	needUserTools(t)
	sockGroup, ml := addGroup(t), addGroup(t)
	alice := addUser(t, sockGroup, ml)
	bob := addUser(t, sockGroup)
	conf := filepath.Join(t.TempDir(), "gpulet.yaml")
	writeConfigFile(t, conf, fmt.Sprintf("pools:\n  training:\n    gpus: [\"0\"]\n    users: [\"group:%s\"]\n", ml))
	d := startForUsers(t, sockGroup, append(policyNode, "--config", conf)...)
	claim := func(u testUser, gpu string) (string, int) {
		t.Helper()
		return asUser(t, d, u, "gpurun", "--offline", "--run-dir", d.RunDir, "--gpu", gpu, "--", "true")
	}
	if out, code := claim(bob, "0"); code == 0 || !strings.Contains(out, "permission denied") {
		t.Fatalf("bob, outside the pool, claimed on its GPU: exit %d\n%s", code, out)
	}
	if out, code := claim(bob, "1"); code != 0 {
		t.Fatalf("bob on the GPU in no pool: exit %d\n%s", code, out)
	}
	// Naming no GPU, bob's claim passes the pool's GPU by.
	if out, code := asUser(t, d, bob, "gpurun", "--offline", "--run-dir", d.RunDir, "--", "true"); code != 0 {
		t.Fatalf("bob naming no GPU: exit %d\n%s", code, out)
	}
	if out, code := claim(alice, "0"); code != 0 {
		t.Fatalf("alice, in the pool, on its GPU: exit %d\n%s", code, out)
	}

	// A pool of a group and a user: the ledger lets both in, through an ACL.
	writeConfigFile(t, conf, fmt.Sprintf("pools:\n  training:\n    gpus: [\"0\"]\n    users: [\"group:%s\", %s]\n", ml, bob.name))
	syscall.Kill(d.Pid(), syscall.SIGHUP)
	testutil.Eventually(t, "the reload", func() bool { return strings.Count(d.Log.String(), "config reloaded") == 1 })
	for _, u := range []testUser{alice, bob} {
		if out, code := claim(u, "0"); code != 0 {
			t.Fatalf("%s after the reload: exit %d\n%s", u.name, code, out)
		}
	}
	// Without pools, the GPU is the socket group's again.
	writeConfigFile(t, conf, "quotas:\n  \"*\": 64\n")
	syscall.Kill(d.Pid(), syscall.SIGHUP)
	testutil.Eventually(t, "the second reload", func() bool { return strings.Count(d.Log.String(), "config reloaded") == 2 })
	var st syscall.Stat_t
	dir := filepath.Join(d.RunDir, "units")
	s, err := d.Client.Snapshot(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(filepath.Join(dir, s.GPUs[0].UUID, "0"), &st); err != nil || st.Mode&0o7777 != 0o1770 {
		t.Fatalf("instance folder mode %#o, %v", st.Mode&0o7777, err)
	}
	if out, code := claim(bob, "0"); code != 0 {
		t.Fatalf("bob without pools: exit %d\n%s", code, out)
	}
}

// TestOfflineClaimsOverAQuotaAreFlagged: a real user's offline claims past
// the user's quota are flagged in the snapshot, gpulet status, /metrics and
// the log, and the user gets no lease until back under.
func TestOfflineClaimsOverAQuotaAreFlagged(t *testing.T) {
	needUserTools(t)
	sockGroup := addGroup(t)
	carol := addUser(t, sockGroup)
	conf := filepath.Join(t.TempDir(), "gpulet.yaml")
	writeConfigFile(t, conf, fmt.Sprintf("quotas:\n  %s: 1\n", carol.name))
	d := startForUsers(t, sockGroup, "--sim-gpus", "1xT4", "--clients-per-instance", "4", "--config", conf)
	gpurun := copyForOthers(t, e2e.Bin("gpurun"))
	var claims []*exec.Cmd
	for range 2 {
		c := carol.command(gpurun, "--offline", "--run-dir", d.RunDir, "--", "sleep", "300")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		defer c.Process.Kill()
		claims = append(claims, c)
	}
	testutil.Eventually(t, "the quota flagged in the snapshot", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && len(s.OverQuota) == 1 && s.OverQuota[0].Quota == carol.name && s.OverQuota[0].Held == 2 && s.OverQuota[0].Limit == 1
	})
	out, code := e2e.Output(t, exec.Command(e2e.Bin("gpulet"), "--socket", d.Socket, "status"))
	if code != 0 || !strings.Contains(out, fmt.Sprintf("quota %s: 2 unit(s) held, over its limit of 1", carol.name)) {
		t.Fatalf("gpulet status: exit %d\n%s", code, out)
	}
	m, err := d.Client.Metrics(e2e.Ctx(t))
	if err != nil || !strings.Contains(string(m), fmt.Sprintf(`gpulet_quota_over_units{quota=%q} 1`, carol.name)) {
		t.Fatalf("/metrics: %v\n%s", err, m)
	}
	if !strings.Contains(d.Log.String(), "quota exceeded") {
		t.Fatalf("not logged:\n%s", d.Log.String())
	}
	if out, code := asUser(t, d, carol, "gpurun", "--", "true"); code == 0 || !strings.Contains(out, "quota_exceeded") {
		t.Fatalf("carol leased while over her quota: exit %d\n%s", code, out)
	}
	// Back under once a claim ends; with none left, she leases again.
	claims[0].Process.Kill()
	claims[0].Wait()
	testutil.Eventually(t, "the flag gone", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && len(s.OverQuota) == 0
	})
	testutil.Eventually(t, "the return logged", func() bool { return strings.Contains(d.Log.String(), "quota back under its limit") })
	claims[1].Process.Kill()
	claims[1].Wait()
	testutil.Eventually(t, "the claims gone", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.GPUs[0].UnitsOffline == 0
	})
	if out, code := asUser(t, d, carol, "gpurun", "--", "true"); code != 0 {
		t.Fatalf("carol back under her quota: exit %d\n%s", code, out)
	}
}
