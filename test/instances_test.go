package test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// TestCheapHoldsLockNoNode is the attack of issue "instances locked by cheap
// leases" with the real binaries, MPS on and real users: one user holds one
// unit on every MPS instance of a 4-GPU node (ttl leases that run nothing, or
// offline claims made by hand), after which another user must still get units
// through gpuletd and through gpurun --offline. Before, both were refused
// with 60 (or 56) units free.
func TestCheapHoldsLockNoNode(t *testing.T) {
	needUserTools(t)
	control, err := exec.LookPath("nvidia-cuda-mps-control")
	if err != nil {
		t.Skip("nvidia-cuda-mps-control is not installed (make test installs Debian's nvidia-cuda-mps as root):", err)
	}
	cases := []struct {
		name    string
		k       int
		extra   []string
		offline bool
	}{
		{name: "K=1, ttl leases", k: 1},
		// Under spread a user's second lease on a GPU goes to its other
		// instance, so ttl leases alone reach every instance.
		{name: "K=2, ttl leases under spread", k: 2, extra: []string{"--policy", "spread"}},
		{name: "K=2, offline claims", k: 2, offline: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sockGroup := addGroup(t)
			mallory, victim := addUser(t, sockGroup), addUser(t, sockGroup)
			runDir, err := os.MkdirTemp("/tmp", "gm")
			if err != nil {
				t.Fatal(err)
			}
			os.Chmod(runDir, 0o755)
			t.Cleanup(func() {
				killControlDaemons(runDir)
				os.RemoveAll(runDir)
			})
			args := append([]string{"--mps", "on", "--mps-control", control, "--run-dir", runDir,
				"--sim-gpus", "4xT4-16GB", "--instances-per-gpu", strconv.Itoa(c.k)}, c.extra...)
			d := startForUsers(t, sockGroup, args...)
			for g := range 4 {
				for k := range c.k {
					if c.offline {
						claim := mallory.role(t, d, "claim", "GPULET_RUN_DIR="+runDir, "GPULET_E2E_GPU="+strconv.Itoa(g), "GPULET_E2E_INSTANCE="+strconv.Itoa(k))
						out, err := claim.StdoutPipe()
						if err != nil {
							t.Fatal(err)
						}
						if err := claim.Start(); err != nil {
							t.Fatal(err)
						}
						t.Cleanup(func() { claim.Process.Kill(); claim.Wait() })
						if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
							t.Fatalf("claim on GPU %d instance %d: %v", g, k, err)
						}
						continue
					}
					body := fmt.Sprintf(`{"units":1,"gpu":"%d","ttl":"720h"}`, g)
					out, code := e2e.Output(t, mallory.role(t, d, "request", "GPULET_E2E_METHOD=POST", "GPULET_E2E_PATH=/v1/leases", "GPULET_E2E_BODY="+body))
					if code != 0 || strings.TrimSpace(out) != "201" {
						t.Fatalf("mallory's lease on GPU %d: exit %d: %s", g, code, out)
					}
				}
			}
			testutil.Eventually(t, "every instance serving mallory", func() bool {
				s, err := d.Client.Snapshot(e2e.Ctx(t))
				if err != nil {
					return false
				}
				for _, g := range s.GPUs {
					for _, in := range g.Instances {
						if g.UnitsUsed != c.k || in.UnitsFree != 16/c.k-1 {
							return false
						}
					}
				}
				return true
			})
			out, code := asUser(t, d, victim, "gpurun", "--units", "4", "--", "true")
			if code != 0 {
				t.Fatalf("another user's lease refused with %d of 64 units held: exit %d\n%s", 4*c.k, code, out)
			}
			// users.json says so too, within its 20 ms: an offline claim gets
			// in.
			testutil.Eventually(t, "another user's offline claim", func() bool {
				_, code := asUser(t, d, victim, "gpurun", "--offline", "--run-dir", runDir, "--", "true")
				return code == 0
			})
			if c.k != 1 {
				return
			}
			// GPU 0 is the one mallory keeps: gpurun --offline refuses it,
			// and a claim made there by hand is flagged and swept.
			out, code = asUser(t, d, victim, "gpurun", "--offline", "--run-dir", runDir, "--gpu", "0", "--", "true")
			if want := fmt.Sprintf("serves uid %d", mallory.uid); code == 0 || !strings.Contains(out, want) {
				t.Fatalf("gpurun --offline on mallory's GPU: exit %d, want %q\n%s", code, want, out)
			}
			claim := victim.role(t, d, "claim", "GPULET_RUN_DIR="+runDir, "GPULET_E2E_GPU=0")
			stdout, err := claim.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := claim.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { claim.Process.Kill(); claim.Wait() })
			unit, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, "the claim by hand swept", func() bool {
				s, err := d.Client.Snapshot(e2e.Ctx(t))
				if err != nil || s.GPUs[0].UnitsUsed != 1 {
					return false
				}
				_, err = os.Lstat(filepath.Join(runDir, "units", s.GPUs[0].UUID, "0", "unit-"+strings.TrimSpace(unit)))
				return os.IsNotExist(err)
			})
			if want := fmt.Sprintf("uid=%d", victim.uid); !strings.Contains(d.Log.String(), "offline claim on an MPS instance that serves another user removed") || !strings.Contains(d.Log.String(), want) {
				t.Fatalf("the claim not flagged with its owner:\n%s", d.Log.String())
			}
		})
	}
}
