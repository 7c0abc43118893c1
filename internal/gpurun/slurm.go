package gpurun

import (
	"context"
	"fmt"

	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/internal/slurmenv"
)

// applySlurm makes gpurun follow the Slurm step it runs in, with no flag: the
// lease is the job's (gpuletd reads the job from gpurun's cgroup, and a step
// whose job holds a lease already gets that lease), its units are the step's
// shards (or its MPS share, or a whole GPU) and its GPU is the one Slurm
// chose, unless --units or --gpu say otherwise.
func (o *Options) applySlurm(ctx context.Context, getenv func(string) string) error {
	c := &client.Client{Socket: o.Socket}
	step, err := slurmenv.Read(getenv, func() (int, error) { return UnitsPerGPU(ctx, c) })
	if err != nil {
		return fmt.Errorf("in Slurm job %s: %w", getenv(slurmenv.EnvJobID), err)
	}
	o.Slurm = true
	if o.GPUs > 0 {
		// Whole GPUs asked: the step's shards and GPU do not apply.
		return nil
	}
	if !o.unitsGiven && step.Units > 0 {
		o.Units = step.Units
	}
	if !o.gpuGiven && step.GPU != "" {
		o.GPU = step.GPU
	}
	return nil
}

// UnitsPerGPU asks gpuletd how many units each of the node's GPUs has.
func UnitsPerGPU(ctx context.Context, c *client.Client) (int, error) {
	l, err := c.GPUs(ctx)
	if err != nil {
		return 0, err
	}
	if len(l.GPUs) == 0 {
		return 0, fmt.Errorf("gpuletd reports no GPU")
	}
	return l.GPUs[0].UnitsTotal, nil
}
