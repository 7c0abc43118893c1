package server

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/agent/procwatch"
	"github.com/gpulet/gpulet/api"
)

func TestDecodeRequest(t *testing.T) {
	tests := []struct {
		name, body, wantMsg string
	}{
		{"ok", `{"units":2,"gpu":"0","ttl":"30s","labels":{"a":"b"}}`, ""},
		{"empty body", ``, "empty"},
		{"malformed", `{"units":`, "malformed JSON"},
		{"unknown field", `{"units":1,"colour":"red"}`, `unknown field "colour"`},
		{"units string", `{"units":"2"}`, "units: must be a whole number"},
		{"units zero", `{"units":0}`, "units: must be at least 1"},
		{"units negative", `{"units":-4}`, "units: must be at least 1"},
		{"units fraction", `{"units":1.5}`, "units: must be a whole number"},
		{"bad ttl", `{"units":1,"ttl":"soon"}`, "ttl: \"soon\" is not a duration"},
		{"tiny ttl", `{"units":1,"ttl":"1ms"}`, "ttl: 1ms is outside"},
		{"bad wait", `{"units":1,"wait":"-3s"}`, "wait: -3s is outside"},
		{"ttl and pid", `{"units":1,"ttl":"5s","pid":42}`, "pid and ttl"},
		{"two values", `{"units":1}{"units":1}`, "more than one JSON value"},
		{"trailing", `{"units":1} x`, "more than one JSON value"},
		{"control chars", `{"units":1,"task":"a\u0000b"}`, "task: control characters"},
		{"array", `[1]`, "must be an object"},
		{"pid negative", `{"units":1,"pid":-1}`, "pid: must be a process id"},
		{"pid above pid_max", `{"units":1,"pid":4194304}`, "pid: must be a process id from 1 to 4194303"},
		{"pid of 2^31", `{"units":1,"pid":2147483648}`, "pid: must be a process id"},
		{"pid of 2^32+1", `{"units":1,"pid":4294967297}`, "pid: must be a process id"},
		{"pid beyond int64", `{"units":1,"pid":9223372036854775808}`, "pid: must be a whole number"},
		{"min cc", `{"units":1,"min_cc":"8.0"}`, ""},
		{"min cc without minor", `{"units":1,"min_cc":"8"}`, `min_cc: "8" is not a compute capability MAJOR.MINOR`},
		{"min cc as a number", `{"units":1,"min_cc":8.0}`, "min_cc: must be a string"},
		{"min cc words", `{"units":1,"min_cc":"ampere"}`, `min_cc: "ampere" is not`},
		{"min cc zero", `{"units":1,"min_cc":"0.0"}`, "min_cc: \"0.0\" is not a compute capability: they start at 1.0"},
		{"whole gpus", `{"gpus":2,"ttl":"1m","pool":"a","memory_mib":1024,"wait":"5s"}`, ""},
		{"whole gpus units zero", `{"gpus":2,"units":0}`, ""},
		{"whole gpus and units", `{"gpus":2,"units":1}`, "units and gpus: a request asks for units of one GPU or for whole GPUs, not both"},
		{"whole gpus and gpu", `{"gpus":2,"gpu":"0"}`, "gpu and gpus: a request for whole GPUs cannot name one GPU"},
		{"whole gpus and reservation", `{"gpus":1,"reservation":"r"}`, "gpus: whole GPUs are not drawn from a reservation nor borrowed"},
		{"whole gpus preemptible", `{"gpus":1,"preemptible":true}`, "gpus: whole GPUs are not drawn from a reservation nor borrowed"},
		{"whole gpus negative", `{"gpus":-1}`, "gpus: must be at least 1 when given, got -1"},
		{"whole gpus string", `{"gpus":"2"}`, "gpus: must be a whole number"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := DecodeRequestBytes([]byte(tc.body))
			if tc.wantMsg == "" {
				if err != nil {
					t.Fatal(err)
				}
				if req.MinCC != "" && req.MinCapability.String() != req.MinCC {
					t.Fatalf("min_cc %q parsed as %v", req.MinCC, req.MinCapability)
				}
				return
			}
			if !errors.Is(err, api.ErrBadRequest) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("err = %v, want bad_request containing %q", err, tc.wantMsg)
			}
		})
	}
}

func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{`{"units":1}`, `{"units":2,"gpu":"GPU-x","ttl":"30s","wait":"1s","labels":{"k":"v"}}`, `{"units":1,"pid":1}`, `{`, `null`, `{"units":1e99}`, `{"labels":{"":""}}`,
		`{"units":1,"pid":4194303}`, `{"units":1,"pid":4194304}`, `{"units":1,"pid":2147483648}`, `{"units":1,"pid":-2147483648}`, `{"units":1,"pid":4294967297}`,
		`{"units":1,"min_cc":"8.0"}`, `{"units":1,"min_cc":"12.1"}`, `{"units":1,"min_cc":"8"}`, `{"units":1,"min_cc":""}`, `{"units":1,"min_cc":null}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		req, err := DecodeRequestBytes([]byte(body))
		if err != nil {
			if status, _ := api.StatusOf(err); status != 400 && status != 413 {
				t.Fatalf("decode error %v maps to %d, want 400", err, status)
			}
			return
		}
		if req.Units < 1 || (req.TTL > 0 && req.PID != 0) || len(req.Labels) > maxLabels || req.PID < 0 || req.PID > procwatch.MaxPID {
			t.Fatalf("accepted an invalid request %+v", req)
		}
		// A min_cc is kept only parsed, and as what was sent.
		if (req.MinCC == "") != req.MinCapability.IsZero() || req.MinCC != "" && req.MinCapability.Major < 1 {
			t.Fatalf("min_cc %q kept as %v", req.MinCC, req.MinCapability)
		}
	})
}

func TestSlurmRequestValidation(t *testing.T) {
	for _, body := range []string{`{"units":1,"slurm":"node"}`, `{"units":1,"slurm":"job","ttl":"1m"}`, `{"units":1,"slurm":"job","pid":1}`} {
		if _, err := DecodeRequestBytes([]byte(body)); !errors.Is(err, api.ErrBadRequest) {
			t.Errorf("%s: %v, want a bad request", body, err)
		}
	}
	if r, err := DecodeRequestBytes([]byte(`{"units":1,"slurm":"step"}`)); err != nil || r.Slurm != "step" {
		t.Errorf("a step request: %+v, %v", r, err)
	}
}
