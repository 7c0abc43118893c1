package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// readmeBlock is the n-th ```sh block (from 0) of the README's section
// heading, as its lines.
func readmeBlock(t *testing.T, heading string, n int) []string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no section %q", heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	blocks := strings.Split(section, "```sh\n")
	if len(blocks) <= n+1 {
		t.Fatalf("README.md, %s: no sh block %d", heading, n)
	}
	block, _, _ := strings.Cut(blocks[n+1], "```")
	return strings.Split(strings.TrimSpace(block), "\n")
}

// TestReadmeOnABox runs the README's quick start for users of a node, as it
// is written, as a user in the socket's group: python is a script that says
// where it runs.
func TestReadmeOnABox(t *testing.T) {
	needUserTools(t)
	sockGroup := addGroup(t)
	d := startForUsers(t, sockGroup)
	u := addUser(t, sockGroup)
	bin := filepath.Dir(copyForOthers(t, e2e.Bin("gpurun")))
	for _, name := range []string{"gpulet"} {
		copyFile(e2e.Bin(name), filepath.Join(bin, name))
	}
	python := "#!/bin/sh\necho \"python $* on CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES lease $GPULET_LEASE_ID\"\ngpulet leases --all\n"
	if err := os.WriteFile(filepath.Join(bin, "python"), []byte(python), 0o755); err != nil {
		t.Fatal(err)
	}
	// Root holds a lease and an offline claim beside the user's.
	rootLease, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m", GPU: "1"})
	if err != nil {
		t.Fatal(err)
	}
	claim := exec.Command(e2e.Bin("gpurun"), "--offline", "--run-dir", d.RunDir, "--gpu", "1", "--", "sleep", "60")
	if err := claim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { claim.Process.Kill(); claim.Wait() })
	testutil.Eventually(t, "the offline claim in the snapshot", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && len(s.GPUs[1].Claims) == 1
	})
	lines := readmeBlock(t, "On a box where gpulet runs", 0)
	cmd := u.command("sh", "-ec", strings.Join(lines, "\n"))
	cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin", "GPULET_SOCKET=" + d.Socket, "LANG=C"}
	out, code := e2e.Output(t, cmd)
	for _, want := range []string{
		"backend: simulated", // gpulet status
		"python train.py on CUDA_VISIBLE_DEVICES=GPU-",
		u.name,   // the lease, its user named, while the command runs
		" root ", // root's lease, shown to the user
		"offline claims",
		"sleep 60", // the claim's command
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the README's quick start lacks %q in its output:\n%s", want, out)
		}
	}
	if code != 0 {
		t.Errorf("the README's quick start exited %d:\n%s", code, out)
	}
	if strings.Contains(out, rootLease.ID) {
		t.Errorf("the user was shown root's lease id %s:\n%s", rootLease.ID, out)
	}
}

// TestReadmeTryIt: the commands the README shows after make run's exports are
// the banner's, and they work against the gpuletd make run started.
func TestReadmeTryIt(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("make run as root with RUN_DIR stands for a private instance; runs as", os.Getuid())
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed:", err)
	}
	lines := readmeBlock(t, "Try it or develop it", 1)
	clone := makeClone(t, nil)
	runDir := shortTemp(t, "gmt")
	r := startMakeRun(t, clone, nil, os.Environ(), "RUN_DIR="+runDir)
	r.check(t, filepath.Join(runDir, "gpulet.sock"), false)
	var script []string
	for _, l := range lines {
		if strings.HasPrefix(l, "export ") {
			continue // the banner's exports name this run's folders
		}
		if !strings.Contains(r.out.String(), "  "+l+"\n") {
			t.Errorf("make run's banner does not show the README's %q:\n%s", l, r.out)
		}
		script = append(script, l)
	}
	cmd := exec.Command("sh", "-ec", strings.Join(script, "\n"))
	cmd.Dir = clone
	cmd.Env = append(os.Environ(), "GPULET_SOCKET="+r.socket, "GPULET_RUN_DIR="+runDir)
	out, code := e2e.Output(t, cmd)
	if code != 0 || !strings.Contains(out, "backend: simulated") || !strings.Contains(out, `"schema":"gpulet.snapshot/v1"`) {
		t.Errorf("the README's commands after make run: exit %d\n%s", code, out)
	}
	r.stop(t)
}
