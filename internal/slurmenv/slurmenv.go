// Package slurmenv reads what Slurm gave a job step from its environment: how
// many gpulet units it asked for and on which GPU. It decides nothing about
// who the job is: gpuletd reads that from the caller's cgroup. A step's
// environment only says what to ask for, and gpuletd checks the request like
// any other.
package slurmenv

import (
	"fmt"
	"strconv"
	"strings"
)

// Environment variables Slurm sets in a step.
const (
	EnvJobID        = "SLURM_JOB_ID"
	EnvStepID       = "SLURM_STEP_ID"
	EnvShardsOnNode = "SLURM_SHARDS_ON_NODE"
	EnvStepGPUs     = "SLURM_STEP_GPUS"
	EnvJobGPUs      = "SLURM_JOB_GPUS"
	EnvGPUsOnNode   = "SLURM_GPUS_ON_NODE"
	// EnvMPSPercentage is what Slurm's gres/mps sets: the step's share of the
	// GPU's threads.
	EnvMPSPercentage = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
)

// batchStepIDs are SLURM_STEP_ID of a batch script's step: its name, and
// SLURM_BATCH_SCRIPT as a number (0xfffffffe).
var batchStepIDs = map[string]bool{"batch": true, "4294967294": true}

// Step is what a Slurm step asks of gpulet.
type Step struct {
	JobID string
	// Batch is set for the step that runs a batch script.
	Batch bool
	// Units is the step's units: its shards, its MPS share converted, or a
	// whole GPU for a GPU gres; 0 when the step asked for no GPU.
	Units int
	// GPU is the NVML index of the GPU Slurm chose; empty when Slurm named
	// none.
	GPU string
}

// InJob reports whether getenv is a Slurm job's environment.
func InJob(getenv func(string) string) bool { return getenv(EnvJobID) != "" }

// Read reads a step's request from its environment. unitsPerGPU returns the
// node's units per GPU; it is called only when the step's share is given as a
// percentage or a whole GPU, since asking gpuletd costs a round trip.
func Read(getenv func(string) string, unitsPerGPU func() (int, error)) (Step, error) {
	s := Step{JobID: getenv(EnvJobID)}
	if s.JobID == "" {
		return s, fmt.Errorf("%s is not set: not in a Slurm job", EnvJobID)
	}
	s.Batch = batchStepIDs[getenv(EnvStepID)]
	gpus := getenv(EnvStepGPUs)
	if gpus == "" {
		gpus = getenv(EnvJobGPUs)
	}
	if gpus != "" {
		list := strings.Split(gpus, ",")
		if len(list) > 1 {
			return s, fmt.Errorf("this step has GPUs %s from Slurm: a gpulet lease is units of one GPU; ask for shards of one GPU (--gres=shard:N)", gpus)
		}
		if _, err := strconv.ParseUint(list[0], 10, 16); err != nil {
			return s, fmt.Errorf("%s=%q: not a GPU index", EnvStepGPUs, gpus)
		}
		s.GPU = list[0]
	}
	if v := getenv(EnvShardsOnNode); v != "" {
		n, err := positive(EnvShardsOnNode, v)
		if err != nil {
			return s, err
		}
		s.Units = n
		return s, nil
	}
	pct, whole := getenv(EnvMPSPercentage), getenv(EnvGPUsOnNode) != ""
	if pct == "" && !whole {
		return s, nil
	}
	u, err := unitsPerGPU()
	if err != nil {
		return s, err
	}
	if u < 1 {
		return s, fmt.Errorf("gpuletd reports %d units per GPU", u)
	}
	if pct == "" {
		s.Units = u
		return s, nil
	}
	p, err := positive(EnvMPSPercentage, pct)
	if err != nil || p > 100 {
		return s, fmt.Errorf("%s=%q: want a percentage from 1 to 100", EnvMPSPercentage, pct)
	}
	// Rounded up: a step never gets less of the GPU than Slurm gave it.
	s.Units = (p*u + 99) / 100
	return s, nil
}

func positive(name, v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 1<<20 {
		return 0, fmt.Errorf("%s=%q: want a whole number from 1", name, v)
	}
	return n, nil
}
