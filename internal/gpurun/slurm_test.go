package gpurun

import (
	"context"
	"io"
	"path/filepath"
	"testing"

	"github.com/gpulet/gpulet/api"
)

func TestSlurmStepChoosesUnitsAndGPU(t *testing.T) {
	env := map[string]string{"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_SHARDS_ON_NODE": "4", "SLURM_STEP_GPUS": "1"}
	getenv := func(k string) string { return env[k] }

	o, err := Parse([]string{"--", "true"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.applySlurm(context.Background(), getenv); err != nil {
		t.Fatal(err)
	}
	if r := o.request(); r.Units != 4 || r.GPU != "1" || r.Slurm != api.SlurmScopeJob {
		t.Fatalf("request %+v, want 4 units of GPU 1 for the Slurm job", r)
	}

	// Flags win over Slurm's choice; the lease is still the job's.
	o, _ = Parse([]string{"--units", "2", "--gpu", "0", "--", "true"}, io.Discard)
	if err := o.applySlurm(context.Background(), getenv); err != nil {
		t.Fatal(err)
	}
	if r := o.request(); r.Units != 2 || r.GPU != "0" || r.Slurm != api.SlurmScopeJob {
		t.Fatalf("request %+v, want the flags' 2 units of GPU 0 for the Slurm job", r)
	}

	// A whole-GPU gres needs the node's units per GPU: with no gpuletd,
	// gpurun fails rather than guess.
	env = map[string]string{"SLURM_JOB_ID": "9", "SLURM_GPUS_ON_NODE": "1"}
	o, _ = Parse([]string{"--socket", filepath.Join(t.TempDir(), "none.sock"), "--", "true"}, io.Discard)
	if err := o.applySlurm(context.Background(), getenv); err == nil {
		t.Fatal("a whole GPU with no gpuletd to ask: no error")
	}
	env = map[string]string{"SLURM_JOB_ID": "9", "SLURM_STEP_GPUS": "0,1"}
	if err := o.applySlurm(context.Background(), getenv); err == nil {
		t.Fatal("two GPUs for one lease: no error")
	}
}
