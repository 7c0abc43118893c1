// Package offline claims units without gpuletd, by the pipe-file protocol of
// the ledger: a FIFO made under a temporary name, locked, then linked to
// unit-<i>. The locks are held by descriptors that survive exec, so a claim
// lives exactly as long as the process that made it (and what it execs).
package offline

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/agent/ledger"
)

// DefaultRunDir is where gpuletd keeps its ledger unless told otherwise.
const DefaultRunDir = "/run/gpulet"

// RunDirEnv overrides DefaultRunDir.
const RunDirEnv = "GPULET_RUN_DIR"

// RunDir picks the run dir: flag, else GPULET_RUN_DIR, else the default.
func RunDir(flag string) string {
	if flag != "" {
		return flag
	}
	if d := os.Getenv(RunDirEnv); d != "" {
		return d
	}
	return DefaultRunDir
}

// maxLayout bounds layout.json: the largest node's layout is far smaller.
const maxLayout = 16 << 20

// ReadLayout reads and checks <runDir>/units/layout.json.
func ReadLayout(runDir string) (*ledger.Layout, error) {
	path := filepath.Join(runDir, "units", ledger.LayoutFile)
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("no pipe-file ledger at %s: gpuletd has never run with this run dir (use --run-dir or %s)", path, RunDirEnv)
		}
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxLayout+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(b) > maxLayout {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxLayout)
	}
	lay, err := DecodeLayout(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return lay, nil
}

// DecodeLayout parses layout.json and checks what the claim relies on: known
// schema, UUIDs that are one path element, units inside units_total.
func DecodeLayout(b []byte) (*ledger.Layout, error) {
	var lay ledger.Layout
	if err := json.Unmarshal(b, &lay); err != nil {
		return nil, fmt.Errorf("malformed layout: %w", err)
	}
	if lay.Schema != ledger.LayoutSchema {
		return nil, fmt.Errorf("layout schema %q, want %q", lay.Schema, ledger.LayoutSchema)
	}
	for _, g := range lay.GPUs {
		if g.UUID == "" || strings.ContainsAny(g.UUID, "/\x00") || g.UUID == "." || g.UUID == ".." {
			return nil, fmt.Errorf("layout: GPU %d has a bad UUID %q", g.Index, g.UUID)
		}
		if g.UnitsTotal < 1 {
			return nil, fmt.Errorf("layout: GPU %d has %d units", g.Index, g.UnitsTotal)
		}
		for _, in := range g.Instances {
			if in.Instance < 0 {
				return nil, fmt.Errorf("layout: GPU %d has instance %d", g.Index, in.Instance)
			}
			for _, u := range in.Units {
				if u < 0 || u >= g.UnitsTotal {
					return nil, fmt.Errorf("layout: GPU %d instance %d has unit %d outside 0..%d", g.Index, in.Instance, u, g.UnitsTotal-1)
				}
			}
		}
	}
	return &lay, nil
}

// Request says what to claim.
type Request struct {
	Units int
	// GPU is an index or UUID; empty: any.
	GPU string
	// Type is a case-insensitive substring of the GPU's name; empty: any.
	Type string
}

// Claim is a set of held units.
type Claim struct {
	GPU      ledger.LayoutGPU
	Instance int
	Units    []int
	// FDs hold the locks; they are inherited across exec.
	FDs []int
	// Env is what the process runs with.
	Env map[string]string
}

// ErrNoUnits means no instance had enough free unit names.
var ErrNoUnits = errors.New("no free units")

// Take claims req.Units units of one instance of one GPU of the layout, the
// first that has them.
func Take(runDir string, lay *ledger.Layout, req Request) (*Claim, error) {
	if req.Units < 1 {
		return nil, fmt.Errorf("--units must be at least 1, got %d", req.Units)
	}
	matched := false
	for _, g := range lay.GPUs {
		if req.GPU != "" && req.GPU != strconv.Itoa(g.Index) && !strings.EqualFold(req.GPU, g.UUID) {
			continue
		}
		if req.Type != "" && !strings.Contains(strings.ToLower(g.Name), strings.ToLower(req.Type)) {
			continue
		}
		matched = true
		for _, in := range g.Instances {
			dir := filepath.Join(runDir, "units", g.UUID, strconv.Itoa(in.Instance))
			units, fds, err := claimIn(dir, in.Units, req.Units)
			if err != nil {
				return nil, err
			}
			if units == nil {
				continue
			}
			return &Claim{GPU: g, Instance: in.Instance, Units: units, FDs: fds, Env: scaleEnv(in.Env, len(units), g.UnitsTotal)}, nil
		}
	}
	if !matched {
		return nil, fmt.Errorf("no GPU in the layout matches --gpu %q --type %q", req.GPU, req.Type)
	}
	return nil, fmt.Errorf("%w: no instance has %d free unit(s)", ErrNoUnits, req.Units)
}

// claimIn claims n of the unit names in dir, or none (nil) when fewer are free.
func claimIn(dir string, names []int, n int) ([]int, []int, error) {
	var units, fds []int
	undo := func() {
		for i, u := range units {
			unix.Unlink(filepath.Join(dir, ledger.UnitName(u)))
			unix.Close(fds[i])
		}
	}
	for _, u := range names {
		if len(units) == n {
			break
		}
		fd, ok, err := claimOne(dir, u)
		if err != nil {
			undo()
			return nil, nil, err
		}
		if ok {
			units = append(units, u)
			fds = append(fds, fd)
		}
	}
	if len(units) < n {
		undo()
		return nil, nil, nil
	}
	return units, fds, nil
}

// claimOne tries to claim unit u in dir: ok is false when it is taken.
func claimOne(dir string, u int) (fd int, ok bool, err error) {
	tmp := filepath.Join(dir, fmt.Sprintf(".claim-%d-%d", os.Getpid(), u))
	if err := unix.Mkfifo(tmp, 0o600); err != nil {
		return -1, false, fmt.Errorf("cannot make a claim FIFO in %s: %w", dir, err)
	}
	defer unix.Unlink(tmp)
	// No O_CLOEXEC: the lock must outlive exec into the command.
	fd, err = unix.Open(tmp, unix.O_RDWR|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, false, fmt.Errorf("cannot open claim FIFO: %w", err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		return -1, false, fmt.Errorf("cannot lock claim FIFO: %w", err)
	}
	err = unix.Link(tmp, filepath.Join(dir, ledger.UnitName(u)))
	if errors.Is(err, unix.EEXIST) {
		unix.Close(fd)
		return -1, false, nil
	}
	if err != nil {
		unix.Close(fd)
		return -1, false, fmt.Errorf("cannot link claim: %w", err)
	}
	return fd, true, nil
}

// scaleEnv turns layout.json's one-unit environment into n units'.
func scaleEnv(env map[string]string, n, total int) map[string]string {
	out := map[string]string{}
	for k, v := range env {
		out[k] = v
	}
	out["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = strconv.Itoa((100*n + total - 1) / total)
	if v, ok := env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]; ok {
		var dev int
		var mib uint64
		if _, err := fmt.Sscanf(v, "%d=%dM", &dev, &mib); err == nil {
			out["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = fmt.Sprintf("%d=%dM", dev, mib*uint64(n))
		}
	}
	return out
}

// Release gives the units back: for a claim that will not be used after all.
func (c *Claim) Release(runDir string) {
	dir := filepath.Join(runDir, "units", c.GPU.UUID, strconv.Itoa(c.Instance))
	for i, u := range c.Units {
		unix.Unlink(filepath.Join(dir, ledger.UnitName(u)))
		unix.Close(c.FDs[i])
	}
}
