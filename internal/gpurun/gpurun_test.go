package gpurun

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    Options
		wantErr string
	}{
		{name: "defaults", args: []string{"--", "python", "train.py"},
			want: Options{Units: 1, Command: []string{"python", "train.py"}}},
		{name: "every flag", args: []string{"--units", "2", "--gpu", "1", "--pool", "p", "--type", "a100", "--memory", "8G", "--min-cc", "8.0", "--task", "t", "--reservation", "wf", "--wait", "10s", "--socket", "/s", "--run-dir", "/r", "--", "x"},
			want: Options{Units: 2, GPU: "1", Pool: "p", Type: "a100", MemoryMiB: 8192, MinCC: "8.0", Task: "t", Reservation: "wf", Wait: 10 * time.Second, Socket: "/s", RunDir: "/r", Command: []string{"x"}, unitsGiven: true, gpuGiven: true}},
		{name: "short units and = form", args: []string{"-n", "3", "--gpu=GPU-abc", "x"},
			want: Options{Units: 3, GPU: "GPU-abc", Command: []string{"x"}, unitsGiven: true, gpuGiven: true}},
		{name: "offline", args: []string{"--offline", "--units", "2", "--type", "T4", "--", "x"},
			want: Options{Units: 2, Type: "T4", Offline: true, Command: []string{"x"}, unitsGiven: true}},
		{name: "command flags are the command's", args: []string{"python", "--units", "9", "--", "y"},
			want: Options{Units: 1, Command: []string{"python", "--units", "9", "--", "y"}}},
		{name: "no command", args: []string{"--units", "2"}, wantErr: "no command given"},
		{name: "only --", args: []string{"--"}, wantErr: "no command given"},
		{name: "zero units", args: []string{"--units", "0", "--", "x"}, wantErr: "--units must be at least 1"},
		{name: "units not a number", args: []string{"--units", "two", "--", "x"}, wantErr: "invalid argument"},
		{name: "bad memory", args: []string{"--memory", "lots", "--", "x"}, wantErr: `--memory "lots"`},
		{name: "bad wait", args: []string{"--wait", "soon", "--", "x"}, wantErr: `"soon" for "--wait"`},
		{name: "negative wait", args: []string{"--wait", "-1s", "--", "x"}, wantErr: "want a positive duration"},
		{name: "offline with wait", args: []string{"--offline", "--wait", "1s", "--", "x"}, wantErr: "--wait needs gpuletd"},
		{name: "offline with pool", args: []string{"--offline", "--pool", "p", "--", "x"}, wantErr: "--pool needs gpuletd"},
		{name: "offline with memory", args: []string{"--offline", "--memory", "1G", "--", "x"}, wantErr: "--memory needs gpuletd"},
		{name: "offline with min cc", args: []string{"--offline", "--min-cc", "8.0", "--", "x"}, wantErr: "--min-cc needs gpuletd"},
		{name: "offline with preemptible", args: []string{"--offline", "--preemptible", "--", "x"}, wantErr: "--preemptible needs gpuletd"},
		{name: "dry run with offline", args: []string{"--offline", "--dry-run"}, wantErr: "--dry-run asks gpuletd"},
		{name: "whole gpus", args: []string{"--gpus", "2", "--type", "A100", "--", "x"},
			want: Options{Units: 1, GPUs: 2, Type: "A100", Command: []string{"x"}}},
		{name: "whole gpus zero", args: []string{"--gpus", "0", "--", "x"}, wantErr: "--gpus must be at least 1, got 0"},
		{name: "whole gpus and units", args: []string{"--gpus", "2", "--units", "1", "--", "x"}, wantErr: "--gpus asks for whole GPUs: it cannot be used with --units"},
		{name: "whole gpus and gpu", args: []string{"--gpus", "2", "--gpu", "1", "--", "x"}, wantErr: "--gpus asks for whole GPUs: it cannot be used with --gpu"},
		{name: "whole gpus and reservation", args: []string{"--gpus", "1", "--reservation", "r", "--", "x"}, wantErr: "cannot be used with --reservation"},
		{name: "offline whole gpus", args: []string{"--offline", "--gpus", "2", "--", "x"}, wantErr: "--gpus needs gpuletd: it cannot be used with --offline"},
		{name: "min cc without minor", args: []string{"--min-cc", "8", "--", "x"}, wantErr: `--min-cc: "8" is not a compute capability MAJOR.MINOR`},
		{name: "min cc of a name", args: []string{"--min-cc", "sm_80", "--", "x"}, wantErr: `--min-cc: "sm_80" is not`},
		{name: "unknown flag", args: []string{"--nodes", "2", "--", "x"}, wantErr: "unknown flag: --nodes"},
		{name: "help", args: []string{"--help"}, wantErr: "help requested"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := Parse(tc.args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(o.Command, tc.want.Command) {
				t.Fatalf("command %q, want %q", o.Command, tc.want.Command)
			}
			o.Command, tc.want.Command = nil, nil
			if !reflect.DeepEqual(o, tc.want) {
				t.Fatalf("got %+v\nwant %+v", o, tc.want)
			}
		})
	}
}

func TestParseMemory(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
	}{
		{"8G", 8192}, {"8g", 8192}, {"8GiB", 8192}, {"8GB", 8192}, {"512M", 512}, {"512MiB", 512}, {"512mb", 512},
		{"8000M", 8000}, {"1T", 1 << 20}, {"1TiB", 1 << 20}, {"007M", 7},
	} {
		if got, err := ParseMemory(tc.in); err != nil || got != tc.want {
			t.Errorf("ParseMemory(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "0", "8", "8000", "0G", "-1G", "+1G", "1.5G", "G", "8X", "8B", "8iB", "8 G", " 8G", "8G ", "1e3", "0x10", "1_000", "1048577G", "99999999999999999999999"} {
		if got, err := ParseMemory(bad); err == nil {
			t.Errorf("ParseMemory(%q) accepted as %d", bad, got)
		}
	}
}

// A number without its unit names the two it may have meant.
func TestMemoryNeedsAUnit(t *testing.T) {
	_, err := ParseMemory("8")
	if want := "--memory 8: give its unit: 8G for GiB, 8M for MiB"; err == nil || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
}

func FuzzParseMemory(f *testing.F) {
	for _, s := range []string{"8G", "512M", "8000", "8000M", "1T", "0", "x", "8GiB", "1.5G", "18446744073709551615T"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseMemory(s)
		if err != nil {
			return
		}
		if n == 0 || n > maxMemoryMiB {
			t.Fatalf("%q parsed as %d MiB", s, n)
		}
		if s[0] < '0' || s[0] > '9' {
			t.Fatalf("%q accepted without a leading number", s)
		}
	})
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"-- true", "--units 2 -- x", "--memory 8G --gpu 0 -- a b", "--offline -- x", "--units", "x", "--wait 1s -n 3 y --units 0", "--offline --task t -- x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		o, err := Parse(strings.Fields(line), io.Discard)
		if err != nil {
			return
		}
		if o.Units < 1 || len(o.Command) == 0 || o.Wait < 0 {
			t.Fatalf("accepted %+v", o)
		}
		if o.Offline && (o.Pool != "" || o.Reservation != "" || o.Wait != 0 || o.MemoryMiB != 0 || o.Task != "") {
			t.Fatalf("accepted daemon-only flags with --offline: %+v", o)
		}
	})
}

func TestMergeEnv(t *testing.T) {
	base := []string{"PATH=/bin", "CUDA_VISIBLE_DEVICES=old", "HOME=/root", "CUDA_MPS_PIPE_DIRECTORY=/stale", "GPULET_LEASE_ID=l-parent", "NOEQUALS"}
	got := MergeEnv(base, map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "7", LeaseIDEnv: "l-1"})
	want := []string{"PATH=/bin", "HOME=/root", "NOEQUALS", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=7", "CUDA_VISIBLE_DEVICES=GPU-1", "GPULET_LEASE_ID=l-1"}
	if !slices.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
	// Every CUDA_MPS_ variable is the lease's (docs/design.md §7), not only
	// those a lease sets: a whole-GPU lease sets none.
	base = []string{"CUDA_MPS_CLIENT_PRIORITY=1", "CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING=1", "CUDA_MPSX=kept", "PATH=/bin"}
	got = MergeEnv(base, map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-1,GPU-2", LeaseIDEnv: "l-2"})
	want = []string{"CUDA_MPSX=kept", "PATH=/bin", "CUDA_VISIBLE_DEVICES=GPU-1,GPU-2", "GPULET_LEASE_ID=l-2"}
	if !slices.Equal(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}
}

func TestLookCommand(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	os.WriteFile(plain, []byte("data"), 0o644)
	prog := filepath.Join(dir, "prog")
	os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755)
	t.Setenv("PATH", dir+":/usr/bin:/bin")
	for _, tc := range []struct {
		name, cmd string
		code      int
		msg       string
	}{
		{"in PATH", "prog", 0, ""},
		{"by path", prog, 0, ""},
		{"missing", "no-such-command-xyz", ExitNotFound, "no-such-command-xyz: command not found"},
		{"missing path", filepath.Join(dir, "nope"), ExitNotFound, "command not found"},
		{"not executable", plain, ExitNotRunnable, plain + ": permission denied"},
		{"a folder", dir, ExitNotRunnable, "permission denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, code, err := lookCommand(tc.cmd)
			if code != tc.code || (err == nil) != (tc.msg == "") || err != nil && err.Error() != tc.msg && !strings.HasSuffix(err.Error(), tc.msg) {
				t.Fatalf("code %d err %v, want %d %q", code, err, tc.code, tc.msg)
			}
		})
	}
}

// fakeDaemon answers POST /v1/leases with insufficient_units (a wait request
// only once the test says so, or when the caller goes away) and GET
// /v1/snapshot with a small node.
type fakeDaemon struct {
	sock     string
	mu       sync.Mutex
	waited   chan struct{} // closed when a wait request arrives
	gone     chan struct{} // closed when the wait request's caller went away
	requests []api.LeaseRequest
}

func startFakeDaemon(t *testing.T) *fakeDaemon {
	t.Helper()
	f := &fakeDaemon{sock: filepath.Join(t.TempDir(), "s"), waited: make(chan struct{}), gone: make(chan struct{})}
	ln, err := net.Listen("unix", f.sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(f.serve)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return f
}

func (f *fakeDaemon) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == "/v1/snapshot" {
		json.NewEncoder(w).Encode(api.Snapshot{Schema: api.SnapshotSchema, State: api.NodeWorking, UnitsTotal: 16, UnitsFree: 0,
			GPUs: []api.GPU{{Index: 0, Name: "Tesla T4", State: api.GPUWorking, Eligible: true, UnitsTotal: 16}}})
		return
	}
	var req api.LeaseRequest
	json.NewDecoder(r.Body).Decode(&req)
	f.mu.Lock()
	f.requests = append(f.requests, req)
	f.mu.Unlock()
	if req.Wait != "" {
		close(f.waited)
		<-r.Context().Done()
		close(f.gone)
		return
	}
	w.WriteHeader(http.StatusConflict)
	json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorDetail{Code: api.CodeInsufficientUnits, Message: "no GPU can take 1 unit(s) now (0 free on the node)"}})
}

func TestRunFailures(t *testing.T) {
	f := startFakeDaemon(t)
	for _, tc := range []struct {
		name       string
		args       []string
		code       int
		stdout     string
		stderr     string
		noRequests bool
	}{
		{name: "help", args: []string{"--help"}, code: 0, stdout: "Examples:\n  gpurun -- python train.py"},
		{name: "usage", args: []string{"--units", "1"}, code: ExitUsage, stderr: "gpurun: no command given", noRequests: true},
		{name: "not found", args: []string{"--socket", f.sock, "--", "no-such-command-xyz"}, code: ExitNotFound, stderr: "gpurun: no-such-command-xyz: command not found\n", noRequests: true},
		{name: "no units", args: []string{"--socket", f.sock, "--gpu", "0", "--", "true"}, code: ExitFailure,
			stderr: "gpurun: insufficient_units: asked for 1 unit(s) on GPU 0: no GPU can take 1 unit(s) now (0 free on the node); use --wait DURATION to queue for units\n"},
		{name: "no daemon", args: []string{"--socket", filepath.Join(t.TempDir(), "none.sock"), "--", "true"}, code: ExitFailure, stderr: "none.sock: is it running?"},
		{name: "no ledger", args: []string{"--offline", "--run-dir", t.TempDir(), "--", "true"}, code: ExitFailure, stderr: "gpurun: --offline: no pipe-file ledger at "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.mu.Lock()
			f.requests = nil
			f.mu.Unlock()
			var out, errb bytes.Buffer
			code := Run(context.Background(), tc.args, &out, &errb)
			if code != tc.code || !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errb.String(), tc.stderr) {
				t.Fatalf("exit %d\nstdout %q\nstderr %q\nwant %d, %q, %q", code, out.String(), errb.String(), tc.code, tc.stdout, tc.stderr)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if tc.noRequests && len(f.requests) > 0 {
				t.Fatalf("asked gpuletd %v before failing", f.requests)
			}
		})
	}
	// The no-daemon message names the way out.
	var errb bytes.Buffer
	Run(context.Background(), []string{"--socket", "/nonexistent/g.sock", "--", "true"}, io.Discard, &errb)
	if !strings.Contains(errb.String(), "cannot reach gpuletd at /nonexistent/g.sock") || !strings.Contains(errb.String(), "gpurun --offline") {
		t.Fatalf("no-daemon message %q", errb.String())
	}
}

// TestWaitIsCancelledBySignal: --wait asks once without waiting, says what it
// waits for, then waits; a signal closes the request and exits 128+signal.
func TestWaitIsCancelledBySignal(t *testing.T) {
	f := startFakeDaemon(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan int, 1)
	var errb testutil.SyncBuffer
	go func() {
		done <- Run(ctx, []string{"--socket", f.sock, "--wait", "1m", "--type", "t4", "--", "true"}, io.Discard, &errb)
	}()
	<-f.waited
	cancel(signalCause{syscall.SIGINT})
	if code := <-done; code != 130 {
		t.Fatalf("exit %d, want 130; stderr %q", code, errb.String())
	}
	<-f.gone
	want := "gpurun: waiting up to 1m0s for 1 unit(s) of type t4 (Ctrl-C gives up); 0 of 16 units free on the node now (GPU 0 Tesla T4: 0 free)\n" +
		"gpurun: interrupt while waiting for units: nothing was leased\n"
	if errb.String() != want {
		t.Fatalf("stderr\n%q\nwant\n%q", errb.String(), want)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) != 2 || f.requests[0].Wait != "" || f.requests[1].Wait != "1m0s" || f.requests[1].TTL != "" || f.requests[1].PID != 0 {
		t.Fatalf("requests %+v", f.requests)
	}
}

func TestCatchSignals(t *testing.T) {
	ctx, stop := catchSignals(context.Background())
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Delivery is asynchronous: stop only once it happened, or the signal
	// would have its default effect on the test binary.
	<-ctx.Done()
	stop()
	if sig := interrupted(ctx); sig != syscall.SIGTERM {
		t.Fatalf("interrupted = %v, want SIGTERM", sig)
	}
	ctx, stop = catchSignals(context.Background())
	stop()
	if sig := interrupted(ctx); sig != 0 || ctx.Err() != nil {
		t.Fatalf("no signal, yet interrupted = %v (%v)", sig, ctx.Err())
	}
}

// TestCatchSignalsKeepsIgnoredOnesIgnored: a signal the caller ignores (a
// shell ignores SIGINT in its background jobs, so that Ctrl-C spares them)
// does not end a wait, as it would not end the command gpurun becomes.
func TestCatchSignalsKeepsIgnoredOnesIgnored(t *testing.T) {
	signal.Ignore(syscall.SIGINT)
	t.Cleanup(func() { signal.Reset(syscall.SIGINT) })
	ctx, stop := catchSignals(context.Background())
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
		t.Fatalf("an ignored SIGINT ended the wait: %v", context.Cause(ctx))
	case <-time.After(200 * time.Millisecond):
	}
	stop()
	if sig := interrupted(ctx); sig != 0 {
		t.Fatalf("interrupted = %v after an ignored SIGINT", sig)
	}
	if !signal.Ignored(syscall.SIGINT) {
		t.Fatal("SIGINT no longer ignored after the wait: the command would not ignore it")
	}
}

// A refusal that can never fit says what was asked once: gpuletd's message
// names the request already.
func TestNeverFitsSaysTheRequestOnce(t *testing.T) {
	err := api.Errorf(api.ErrInsufficientUnits, "%s: 1 unit(s) of type %q: no GPU is of that type", api.NeverFits, "H100")
	got := describe(err, Options{Units: 1, Type: "H100"}).Error()
	want := `insufficient_units: nothing on this node can ever fit the request: 1 unit(s) of type "H100": no GPU is of that type`
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

// --wait on a draining node, which refuses at once, says why it did not wait.
func TestWaitOnADrainingNodeSaysWhy(t *testing.T) {
	err := api.Errorf(api.ErrUnavailable, "the node is draining: no new leases")
	got := describe(err, Options{Units: 1, Wait: 2 * time.Second}).Error()
	want := "unavailable: the node is draining: no new leases; --wait waits for units, not for the node to take leases again: it does once an admin runs gpulet undrain"
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}
