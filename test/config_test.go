package test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/test/e2e"
)

// configCheck runs the real `gpulet config check FILE` on socket and returns
// its stdout, stderr and exit status.
func configCheck(t *testing.T, socket, file string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(e2e.Bin("gpulet"), "config", "check", file)
	cmd.Env = append(os.Environ(), "GPULET_SOCKET="+socket)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return out.String(), errb.String(), ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return out.String(), errb.String(), 0
}

func writeConfig(t *testing.T, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestGpuletConfigCheck(t *testing.T) {
	d := e2e.Start(t, "--sim-gpus", "1xA100-80GB,1xT4")
	gpus, err := d.Client.GPUs(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	t4 := gpus.GPUs[1].UUID
	good := writeConfig(t, "good.yaml", `pools:
  training:
    gpus: ["0", "`+strings.ToLower(t4)+`"]
    users: ["root", "group:root"]
  inference:
    gpus: ["1"]
quotas:
  root: 8
  "group:root": 24
  "*": 32
profiles:
  resnet50:
    "NVIDIA A100-SXM4-80GB": 95s
    "Tesla T4": 410s
score: {cc: 0.5, bandwidth: 0.5}
`)
	// GPU 2 is not on this node of two; its form is right.
	thirdGPU := writeConfig(t, "third.yaml", "pools:\n  big:\n    gpus: [\"0\", \"2\"]\n")
	otherUUID := writeConfig(t, "uuid.yaml", "pools:\n  p:\n    gpus:\n      - GPU-00000000-0000-0000-0000-000000000000\n")
	bad := writeConfig(t, "bad.yaml", "pools:\n  p:\n    gpus: [\"0\"]\nquotas:\n  root: 1.5\n")
	unknownUser := writeConfig(t, "user.yaml", "pools:\n  p:\n    gpus: [\"0\"]\n    users: [root, gpulet-e2e-nobody]\n")
	none := "/nonexistent/gpulet.sock"
	notChecked := "GPUs not checked against a node, only their form: cannot reach gpuletd at " + none + ": is it running?"

	for _, tc := range []struct {
		name, socket, file string
		code               int
		stdout, stderr     string
	}{
		{"good, with a daemon", d.Socket, good, 0, good + ": ok (2 pools, 3 quotas, 1 task profile)\n", ""},
		{"good, without a daemon", none, good, 0, good + ": ok (2 pools, 3 quotas, 1 task profile)\n", "gpulet: " + good + ": " + notChecked},
		{"a GPU the node lacks", d.Socket, thirdGPU, 1, "", "gpulet: " + thirdGPU + ": line 3: pools.big.gpus[1]: no GPU with index 2 (this node has 2)\n"},
		{"a UUID the node lacks", d.Socket, otherUUID, 1, "", "gpulet: " + otherUUID + `: line 4: pools.p.gpus[0]: no GPU with UUID "GPU-00000000-0000-0000-0000-000000000000" on this node` + "\n"},
		{"a GPU not checked without a daemon", none, thirdGPU, 0, thirdGPU + ": ok (1 pool, 0 quotas, 0 task profiles)\n", notChecked},
		{"a bad quota, with a daemon", d.Socket, bad, 1, "", "gpulet: " + bad + ": line 5: quotas.root: 1.5 is not a whole number of units\n"},
		{"a bad quota, without a daemon", none, bad, 1, "", "gpulet: " + bad + ": line 5: quotas.root: 1.5 is not a whole number of units\n"},
		{"an unknown user", d.Socket, unknownUser, 1, "", "gpulet: " + unknownUser + `: line 4: pools.p.users[1]: no user "gpulet-e2e-nobody" on this machine` + "\n"},
		{"an unknown user, without a daemon", none, unknownUser, 1, "", `no user "gpulet-e2e-nobody" on this machine`},
		{"no file", d.Socket, "/nonexistent/config.yaml", 1, "", "gpulet: /nonexistent/config.yaml: no such file or directory\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := configCheck(t, tc.socket, tc.file)
			if code != tc.code || out != tc.stdout || !strings.Contains(errOut, tc.stderr) || tc.stderr == "" && errOut != "" {
				t.Fatalf("exit %d\nstdout %q\nstderr %q\nwant %d, %q, %q", code, out, errOut, tc.code, tc.stdout, tc.stderr)
			}
		})
	}
	// The check reads the file: it changes nothing of gpuletd's.
	if s, err := d.Client.Snapshot(e2e.Ctx(t)); err != nil || s.UnitsFree != s.UnitsTotal || s.State != "working" {
		t.Fatalf("after the checks: %+v, %v", s, err)
	}
}

// TestGpuletConfigCheckAccounts checks a file against users and groups made
// for the test, then after they are gone.
func TestGpuletConfigCheckAccounts(t *testing.T) {
	g := e2e.NewGroup(t)
	u := e2e.NewUser(t, g)
	file := writeConfig(t, "accounts.yaml", "pools:\n  p:\n    gpus: [\"0\"]\n    users: ["+u.Name+", \"group:"+g.Name+"\"]\nquotas:\n  "+u.Name+": 2\n")
	none := "/nonexistent/gpulet.sock"
	if out, errOut, code := configCheck(t, none, file); code != 0 || out != file+": ok (1 pool, 1 quota, 0 task profiles)\n" {
		t.Fatalf("exit %d\nstdout %q\nstderr %q", code, out, errOut)
	}
	if out, err := exec.Command("userdel", u.Name).CombinedOutput(); err != nil {
		t.Fatalf("userdel: %v %s", err, out)
	}
	want := "gpulet: " + file + ": line 4: pools.p.users[0]: no user \"" + u.Name + "\" on this machine\n"
	if out, errOut, code := configCheck(t, none, file); code != 1 || out != "" || !strings.HasSuffix(errOut, want) {
		t.Fatalf("after userdel: exit %d\nstdout %q\nstderr %q\nwant %q", code, out, errOut, want)
	}
}
