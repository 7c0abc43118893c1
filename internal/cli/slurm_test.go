package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
)

// slurmDaemon answers what the Slurm hooks ask, and records the lease
// requests it got.
type slurmDaemon struct {
	mu       sync.Mutex
	requests []api.LeaseRequest
}

func (d *slurmDaemon) serve(t *testing.T) string {
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == "POST" && r.URL.Path == "/v1/leases":
			var req api.LeaseRequest
			json.NewDecoder(r.Body).Decode(&req)
			d.mu.Lock()
			d.requests = append(d.requests, req)
			d.mu.Unlock()
			w.WriteHeader(http.StatusCreated)
			json.NewEncoder(w).Encode(api.Lease{ID: "l-job", Units: make([]int, req.Units), Binding: "slurm", Slurm: &api.LeaseSlurm{JobID: 12},
				Env: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-b", "CUDA_MPS_PIPE_DIRECTORY": "/run/gpulet/mps/1/0/pipe"}})
		case r.URL.Path == "/v1/gpus":
			json.NewEncoder(w).Encode(api.GPUList{GPUs: []api.GPU{
				{Index: 1, UUID: "GPU-b", Name: "NVIDIA A100-SXM4-80GB", UnitsTotal: 16},
				{Index: 0, UUID: "GPU-a", Name: "Tesla T4", UnitsTotal: 8},
			}})
		case r.Method == "DELETE" && r.URL.Path == "/v1/slurm/jobs/12":
			json.NewEncoder(w).Encode(api.SlurmRelease{JobID: 12, Released: []string{"l-job"}})
		default:
			w.WriteHeader(http.StatusForbidden)
			json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorDetail{Code: api.CodeForbidden, Message: "for root and the admin group"}})
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

func TestTaskProlog(t *testing.T) {
	d := &slurmDaemon{}
	sock := d.serve(t)
	run := func(vars map[string]string, batch bool) (string, error) {
		var out bytes.Buffer
		e := &env{c: &client.Client{Socket: sock}, out: &out}
		err := taskProlog(context.Background(), e, func(k string) string { return vars[k] }, batch)
		return out.String(), err
	}
	step := map[string]string{"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0", "SLURM_SHARDS_ON_NODE": "4", "SLURM_STEP_GPUS": "1"}
	out, err := run(step, false)
	want := "export CUDA_MPS_PIPE_DIRECTORY=/run/gpulet/mps/1/0/pipe\nexport CUDA_VISIBLE_DEVICES=GPU-b\nexport GPULET_LEASE_ID=l-job\n"
	if err != nil || out != want {
		t.Fatalf("task prolog: %q, %v; want %q", out, err, want)
	}
	if len(d.requests) != 1 || !reflect.DeepEqual(d.requests[0], api.LeaseRequest{Units: 4, GPU: "1", Slurm: "job"}) {
		t.Fatalf("requests %+v, want 4 units of GPU 1 for the job", d.requests)
	}
	// A job may draw on a workflow reservation.
	withRes := map[string]string{"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0", "SLURM_SHARDS_ON_NODE": "2", "GPULET_RESERVATION": "wf1"}
	if _, err := run(withRes, false); err != nil || d.requests[len(d.requests)-1].Reservation != "wf1" {
		t.Fatalf("with GPULET_RESERVATION: %v, request %+v; want reservation wf1", err, d.requests[len(d.requests)-1])
	}
	// The batch step is skipped unless asked; a step with no GPU gets nothing.
	batch := map[string]string{"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "batch", "SLURM_SHARDS_ON_NODE": "4"}
	if out, err := run(batch, false); err != nil || out != "" {
		t.Fatalf("batch step: %q, %v; want nothing", out, err)
	}
	if out, err := run(batch, true); err != nil || !strings.Contains(out, "export GPULET_LEASE_ID=l-job") {
		t.Fatalf("batch step with --batch: %q, %v", out, err)
	}
	if out, err := run(map[string]string{"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0"}, false); err != nil || out != "" {
		t.Fatalf("a step with no GPU: %q, %v; want nothing", out, err)
	}
	// A whole GPU is the node's units per GPU.
	if _, err := run(map[string]string{"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0", "SLURM_GPUS_ON_NODE": "1", "SLURM_STEP_GPUS": "1"}, false); err != nil || d.requests[len(d.requests)-1].Units != 16 {
		t.Fatalf("a whole GPU: %v, request %+v; want 16 units", err, d.requests[len(d.requests)-1])
	}
	// It fails closed: no daemon, no job.
	var out2 bytes.Buffer
	e := &env{c: &client.Client{Socket: filepath.Join(t.TempDir(), "none")}, out: &out2}
	if err := taskProlog(context.Background(), e, func(k string) string { return step[k] }, false); err == nil || out2.Len() != 0 {
		t.Fatalf("no daemon: %q, %v; want an error and no export", out2.String(), err)
	}
	if _, err := run(map[string]string{"SLURM_SHARDS_ON_NODE": "4"}, false); err == nil {
		t.Fatal("outside a job: no error")
	}
}

func TestWriteExportsRefusesALineBreak(t *testing.T) {
	var out bytes.Buffer
	err := writeExports(&out, &api.Lease{ID: "l-1", Env: map[string]string{"X": "a\nexport LD_PRELOAD=/tmp/x.so"}})
	if err == nil || out.Len() != 0 {
		t.Fatalf("%q, %v; want an error and nothing written", out.String(), err)
	}
}

func TestSlurmCommands(t *testing.T) {
	sock := (&slurmDaemon{}).serve(t)
	for _, tc := range []struct {
		name           string
		args           []string
		code           int
		stdout, stderr string
	}{
		{"release by job", []string{"--socket", sock, "release", "--slurm-job", "12"}, ExitOK, "released l-job (Slurm job 12)\n", ""},
		{"release by job, refused", []string{"--socket", sock, "release", "--slurm-job", "13"}, ExitFailure, "", "gpulet: forbidden: for root and the admin group\n"},
		{"release both", []string{"--socket", sock, "release", "--slurm-job", "12", "l-1"}, ExitUsage, "", "wrong number of arguments"},
		{"gres", []string{"--socket", sock, "slurm", "gres", "--node", "n1", "--dev-prefix", "/dev/fake"}, ExitOK,
			"NodeName=n1 Name=gpu File=/dev/fake0  # Tesla T4 GPU-a\nNodeName=n1 Name=gpu File=/dev/fake1  # NVIDIA A100-SXM4-80GB GPU-b\n" +
				"NodeName=n1 Name=shard Count=8 File=/dev/fake0\nNodeName=n1 Name=shard Count=16 File=/dev/fake1\n# slurm.conf\nGresTypes=gpu,shard\nNodeName=n1 Gres=gpu:2,shard:24", ""},
		{"unknown subcommand", []string{"slurm", "prolog"}, ExitUsage, "", `unknown subcommand "prolog"`},
		{"epilog outside a job", []string{"--socket", sock, "slurm", "epilog"}, ExitFailure, "", "gpulet: epilog: SLURM_JOB_ID is not set: not in a Slurm job (slurmd runs the epilog with it; gpulet release --slurm-job ID ends a job's leases by hand)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SLURM_JOB_ID", "")
			var out, errb bytes.Buffer
			code := Run(context.Background(), tc.args, &out, &errb)
			if code != tc.code || !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errb.String(), tc.stderr) {
				t.Fatalf("gpulet %q: exit %d\nstdout %q\nstderr %q\nwant %d, %q, %q", tc.args, code, out.String(), errb.String(), tc.code, tc.stdout, tc.stderr)
			}
		})
	}
	t.Setenv("SLURM_JOB_ID", "x")
	var out bytes.Buffer
	if code := Run(context.Background(), []string{"--socket", sock, "slurm", "epilog"}, &out, &out); code != ExitFailure || out.String() != "gpulet: epilog: SLURM_JOB_ID=\"x\" is not a job id\n" {
		t.Fatalf("epilog of a bad job id: exit %d, %q", code, out.String())
	}
	t.Setenv("SLURM_JOB_ID", "12")
	out.Reset()
	if code := Run(context.Background(), []string{"--socket", sock, "slurm", "epilog"}, &out, &out); code != ExitOK || out.String() != "released l-job (Slurm job 12)\n" {
		t.Fatalf("epilog: exit %d, %q", code, out.String())
	}
}

func TestWriteLeasesShowsTheSlurmJob(t *testing.T) {
	var out bytes.Buffer
	WriteLeases(&out, []api.Lease{{ID: "l-1", Units: []int{0, 1, 2, 3}, Binding: "slurm", Slurm: &api.LeaseSlurm{JobID: 12}}})
	if s := out.String(); !strings.Contains(s, "when job ends") || !strings.Contains(s, "slurm job 12") {
		t.Fatalf("lease table:\n%s", s)
	}
}

func TestTaskPrologFailureReachesTheTask(t *testing.T) {
	t.Setenv("SLURM_JOB_ID", "12")
	t.Setenv("SLURM_STEP_ID", "0")
	t.Setenv("SLURM_SHARDS_ON_NODE", "4")
	var out, errb bytes.Buffer
	code := Run(context.Background(), []string{"--socket", filepath.Join(t.TempDir(), "none"), "slurm", "task-prolog"}, &out, &errb)
	if code != ExitFailure || !strings.HasPrefix(out.String(), "print gpulet: task prolog of job 12: ") || strings.Count(out.String(), "\n") != 1 || strings.Contains(out.String(), "export") {
		t.Fatalf("exit %d, stdout %q: want exit 1 and one print line saying why", code, out.String())
	}
}

func TestHookArgs(t *testing.T) {
	if got := HookArgs("/usr/lib/gpulet/gpulet-slurm-task-prolog", nil); !reflect.DeepEqual(got, []string{"slurm", "task-prolog"}) {
		t.Errorf("task prolog link: %q", got)
	}
	if got := HookArgs("gpulet-slurm-task-prolog-batch", nil); !reflect.DeepEqual(got, []string{"slurm", "task-prolog", "--batch"}) {
		t.Errorf("task prolog link that leases for the batch step too: %q", got)
	}
	if got := HookArgs("gpulet-slurm-epilog", []string{"--socket", "/s"}); !reflect.DeepEqual(got, []string{"slurm", "epilog", "--socket", "/s"}) {
		t.Errorf("epilog link: %q", got)
	}
	if got := HookArgs("/usr/bin/gpulet", []string{"status"}); !reflect.DeepEqual(got, []string{"status"}) {
		t.Errorf("gpulet: %q", got)
	}
}
