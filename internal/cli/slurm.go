package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/internal/gpurun"
	"github.com/gpulet/gpulet/internal/slurmenv"
)

// The Slurm hooks: a TaskProlog that leases for the task and prints the
// lease's environment as "export" lines, which slurmstepd puts in the task's
// environment; an Epilog that releases what the job still holds; and the
// gres.conf and slurm.conf lines that match this node. Each fails closed: a
// failure exits 1 with a message, which Slurm answers by not starting the
// task (TaskProlog) or by draining the node (Epilog).

var slurmCommand = command{"task-prolog [--batch] | epilog | gres [--dev-prefix P] [--node NAME]",
	`Hooks and configuration for Slurm (see docs/slurm.md).

  task-prolog  for slurm.conf's TaskProlog: lease the step's units for its job
               (its shards, MPS share or whole GPU, on the GPU Slurm chose) and
               print the lease's environment as export lines. The batch
               script's step is skipped unless --batch is given; a step that
               asked for no GPU gets nothing. $GPULET_RESERVATION in the job's
               environment draws the lease on that workflow reservation.
  epilog       for slurm.conf's Epilog (as root): release every lease the job
               ($SLURM_JOB_ID) still holds.
  gres         print the gres.conf and slurm.conf lines of this node: one gpu
               and one shard line per GPU, by NVML index, with as many shards
               as gpulet units.`, 1, 1,
	func(fs *pflag.FlagSet) func(context.Context, *env) error {
		batch := fs.Bool("batch", false, "task-prolog: lease for the batch script's step too")
		devPrefix := fs.String("dev-prefix", "/dev/nvidia", "gres: the device files of the GPUs, the NVML index appended")
		node := fs.String("node", "", "gres: the NodeName of this node (default: the short host name)")
		return func(ctx context.Context, e *env) error {
			switch e.args[0] {
			case "task-prolog":
				return printFailure(e.out, e.c, taskProlog(ctx, e, os.Getenv, *batch))
			case "epilog":
				return slurmEpilog(ctx, e, os.Getenv(slurmenv.EnvJobID))
			case "gres":
				return slurmGres(ctx, e, *devPrefix, *node)
			}
			return usageErr(fmt.Sprintf("unknown subcommand %q: want task-prolog, epilog or gres", e.args[0]))
		}
	}}

// ReservationEnv, in a job's environment (sbatch --export), makes the task
// prolog draw the job's lease on that workflow reservation; gpuletd checks
// that the job's user may.
const ReservationEnv = "GPULET_RESERVATION"

// taskProlog leases for the task's job and prints the export lines.
func taskProlog(ctx context.Context, e *env, getenv func(string) string, batch bool) error {
	step, err := slurmenv.Read(getenv, func() (int, error) { return gpurun.UnitsPerGPU(ctx, e.c) })
	if err != nil {
		return fmt.Errorf("task prolog: %w", err)
	}
	if step.Units == 0 || step.Batch && !batch {
		return nil
	}
	req := api.LeaseRequest{Units: step.Units, GPU: step.GPU, Slurm: api.SlurmScopeJob, Reservation: getenv(ReservationEnv)}
	l, err := e.c.Lease(ctx, req)
	if err != nil {
		return fmt.Errorf("task prolog of job %s: %w", step.JobID, err)
	}
	return writeExports(e.out, l)
}

// printFailure also says err as a TaskProlog "print" line, which slurmstepd
// writes to the task's output even when the prolog fails: the prolog's stderr
// reaches no one.
func printFailure(out io.Writer, c *client.Client, err error) error {
	if err != nil {
		fmt.Fprintln(out, "print gpulet:", strings.Join(strings.Fields(describe(c, err)), " "))
	}
	return err
}

// writeExports prints the lease's environment as TaskProlog lines. Slurm
// takes the rest of an export line as the value, unquoted, so a value that
// holds a line break is refused rather than cut.
func writeExports(w io.Writer, l *api.Lease) error {
	vars := map[string]string{gpurun.LeaseIDEnv: l.ID}
	for k, v := range l.Env {
		vars[k] = v
	}
	keys := make([]string, 0, len(vars))
	for k, v := range vars {
		if strings.ContainsAny(k+v, "\n\r\x00") || strings.ContainsAny(k, "= ") {
			return fmt.Errorf("task prolog: lease %s has a variable that cannot be exported: %q", l.ID, k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "export %s=%s\n", k, vars[k])
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// slurmEpilog releases what job still holds.
func slurmEpilog(ctx context.Context, e *env, job string) error {
	if job == "" {
		return fmt.Errorf("epilog: %s is not set: not in a Slurm job (slurmd runs the epilog with it; gpulet release --slurm-job ID ends a job's leases by hand)", slurmenv.EnvJobID)
	}
	id, err := strconv.ParseUint(job, 10, 64)
	if err != nil || id == 0 {
		return fmt.Errorf("epilog: %s=%q is not a job id", slurmenv.EnvJobID, job)
	}
	return releaseSlurmJob(ctx, e, id)
}

// releaseSlurmJob is gpulet release --slurm-job and the epilog.
func releaseSlurmJob(ctx context.Context, e *env, id uint64) error {
	r, err := e.c.ReleaseSlurmJob(ctx, id)
	if err != nil {
		return err
	}
	for _, l := range r.Released {
		fmt.Fprintf(e.out, "released %s (Slurm job %d)\n", l, id)
	}
	return nil
}

// slurmGres prints the gres.conf and slurm.conf lines of the running node.
func slurmGres(ctx context.Context, e *env, devPrefix, node string) error {
	l, err := e.c.GPUs(ctx)
	if err != nil {
		return err
	}
	if len(l.GPUs) == 0 {
		return fmt.Errorf("gres: gpuletd reports no GPU")
	}
	if node == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("gres: %w (give --node)", err)
		}
		node, _, _ = strings.Cut(h, ".")
	}
	writeGres(e.out, l.GPUs, devPrefix, node)
	return nil
}

// writeGres writes the lines for gpus: shards per GPU = gpulet units per GPU.
func writeGres(w io.Writer, gpus []api.GPU, devPrefix, node string) {
	gpus = append([]api.GPU(nil), gpus...)
	sort.Slice(gpus, func(i, j int) bool { return gpus[i].Index < gpus[j].Index })
	shards := 0
	fmt.Fprintln(w, "# gres.conf: one shard per gpulet unit")
	for _, g := range gpus {
		fmt.Fprintf(w, "NodeName=%s Name=gpu File=%s%d  # %s %s\n", node, devPrefix, g.Index, g.Name, g.UUID)
	}
	for _, g := range gpus {
		fmt.Fprintf(w, "NodeName=%s Name=shard Count=%d File=%s%d\n", node, g.UnitsTotal, devPrefix, g.Index)
		shards += g.UnitsTotal
	}
	fmt.Fprintln(w, "# slurm.conf")
	fmt.Fprintln(w, "GresTypes=gpu,shard")
	fmt.Fprintf(w, "NodeName=%s Gres=gpu:%d,shard:%d  # and the node's CPUs, memory, ...\n", node, len(gpus), shards)
}

// slurmLeaseColumns are the EXPIRES, PID and TASK of a Slurm lease in the
// lease table.
func slurmLeaseColumns(l api.Lease, task string) (exp, pid, withJob string) {
	job := "slurm job " + strconv.FormatUint(l.Slurm.JobID, 10)
	if l.Slurm.Step != "" {
		job += " step " + l.Slurm.Step
	}
	return "when job ends", "-", strings.TrimSpace(job + " " + task)
}

// hookNames are the names gpulet answers to as a Slurm hook: slurm.conf's
// TaskProlog and Epilog name a program and pass it no arguments, so a
// symbolic link of one of these names to gpulet is the hook.
var hookNames = map[string][]string{
	"gpulet-slurm-task-prolog":       {"slurm", "task-prolog"},
	"gpulet-slurm-task-prolog-batch": {"slurm", "task-prolog", "--batch"},
	"gpulet-slurm-epilog":            {"slurm", "epilog"},
}

// HookArgs is the command line gpulet runs when started as argv0 with args:
// a hook's subcommand when argv0 names one, else args.
func HookArgs(argv0 string, args []string) []string {
	if sub, ok := hookNames[filepath.Base(argv0)]; ok {
		return append(slices.Clone(sub), args...)
	}
	return args
}
