package slurmenv

import (
	"errors"
	"testing"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func sixteen() (int, error) { return 16, nil }

func TestRead(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want Step
	}{
		{"shards", map[string]string{EnvJobID: "7", EnvStepID: "0", EnvShardsOnNode: "4", EnvStepGPUs: "1", EnvGPUsOnNode: "1"}, Step{JobID: "7", Units: 4, GPU: "1"}},
		{"batch step", map[string]string{EnvJobID: "7", EnvStepID: "batch", EnvShardsOnNode: "2", EnvJobGPUs: "0"}, Step{JobID: "7", Batch: true, Units: 2, GPU: "0"}},
		{"batch step by number", map[string]string{EnvJobID: "7", EnvStepID: "4294967294"}, Step{JobID: "7", Batch: true}},
		{"no gres", map[string]string{EnvJobID: "7", EnvStepID: "0"}, Step{JobID: "7"}},
		{"whole GPU", map[string]string{EnvJobID: "7", EnvGPUsOnNode: "1", EnvStepGPUs: "1"}, Step{JobID: "7", Units: 16, GPU: "1"}},
		{"mps 25%", map[string]string{EnvJobID: "7", EnvMPSPercentage: "25", EnvStepGPUs: "0"}, Step{JobID: "7", Units: 4, GPU: "0"}},
		{"mps 10% rounds up", map[string]string{EnvJobID: "7", EnvMPSPercentage: "10"}, Step{JobID: "7", Units: 2}},
	} {
		got, err := Read(envOf(tc.env), sixteen)
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
}

func TestReadRefuses(t *testing.T) {
	for name, env := range map[string]map[string]string{
		"not in a job":   {EnvShardsOnNode: "4"},
		"two GPUs":       {EnvJobID: "7", EnvStepGPUs: "0,1"},
		"bad GPU":        {EnvJobID: "7", EnvStepGPUs: "../0"},
		"zero shards":    {EnvJobID: "7", EnvShardsOnNode: "0"},
		"bad shards":     {EnvJobID: "7", EnvShardsOnNode: "4x"},
		"mps over 100":   {EnvJobID: "7", EnvMPSPercentage: "101"},
		"mps not number": {EnvJobID: "7", EnvMPSPercentage: "a"},
	} {
		if s, err := Read(envOf(env), sixteen); err == nil {
			t.Errorf("%s: %+v, want an error", name, s)
		}
	}
	// The units per GPU are asked only when needed, and their failure is
	// the step's.
	down := errors.New("gpuletd down")
	if _, err := Read(envOf(map[string]string{EnvJobID: "7", EnvShardsOnNode: "4"}), func() (int, error) { return 0, down }); err != nil {
		t.Errorf("shards need no units per GPU, got %v", err)
	}
	if _, err := Read(envOf(map[string]string{EnvJobID: "7", EnvGPUsOnNode: "1"}), func() (int, error) { return 0, down }); !errors.Is(err, down) {
		t.Errorf("whole GPU with gpuletd down: %v", err)
	}
}

func FuzzRead(f *testing.F) {
	f.Add("7", "0", "4", "1", "", "")
	f.Add("7", "batch", "", "0,1", "1", "50")
	f.Add("", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, job, step, shards, gpus, onNode, pct string) {
		env := map[string]string{EnvJobID: job, EnvStepID: step, EnvShardsOnNode: shards, EnvStepGPUs: gpus, EnvGPUsOnNode: onNode, EnvMPSPercentage: pct}
		s, err := Read(envOf(env), sixteen)
		if err != nil {
			return
		}
		if s.Units < 0 || s.Units > 1<<20 || s.JobID == "" {
			t.Fatalf("Read(%v) = %+v", env, s)
		}
		if s.GPU != "" {
			for _, r := range s.GPU {
				if r < '0' || r > '9' {
					t.Fatalf("GPU %q is not an index", s.GPU)
				}
			}
		}
	})
}
