package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpulet/gpulet/internal/e2e"
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
	e2e.Eventually(t, "the offline claim counted", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.GPUs[0].UnitsOffline == 1
	})

	os.Remove(conf)
	if err := syscall.Mkfifo(conf, 0o644); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(d.Pid(), syscall.SIGHUP)
	e2e.Eventually(t, "the FIFO refused", func() bool {
		return strings.Contains(d.Log.String(), "not a regular file (a FIFO)")
	})
	claim.Process.Kill()
	claim.Wait()
	e2e.Eventually(t, "the exited claimer's unit freed by the sweep", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		return err == nil && s.GPUs[0].UnitsOffline == 0
	})

	os.Remove(conf)
	writeConfigFile(t, conf, "quotas:\n  \"*\": 3\n")
	syscall.Kill(d.Pid(), syscall.SIGHUP)
	e2e.Eventually(t, "the good file reloaded", func() bool {
		return strings.Contains(d.Log.String(), "SIGHUP: config reloaded")
	})
}
