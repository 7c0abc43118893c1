// Package offline claims units without gpuletd, by the pipe-file protocol of
// docs/design.md §5 (package pipefile): it picks a GPU and an instance of
// layout.json with enough free unit names and claims them there. The locks
// are held by descriptors that survive exec, so a claim lives exactly as long
// as the process that made it (and what it execs).
//
// It reads layout.json but never writes it, and it keeps no record of claims:
// the ledger's folders are the record, and gpuletd counts what is there.
package offline

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/pipefile"
)

// Request says what to claim.
type Request struct {
	Units int
	// GPU is an index or UUID; empty: any.
	GPU string
	// Type is a case-insensitive substring of the GPU's name; empty: any.
	Type string
}

// Claim is a set of held units of one instance of one GPU.
type Claim struct {
	GPU      pipefile.LayoutGPU
	Instance int
	Units    []int
	// FDs hold the locks, one per unit. They are not close-on-exec: the
	// command gpurun execs inherits them and so holds the claim.
	FDs []int
	// Env is what the process runs with: the instance's environment from
	// layout.json, scaled to len(Units).
	Env map[string]string

	dir *pipefile.Folder
}

// ErrNoUnits means no instance of a matching GPU had enough free unit names.
var ErrNoUnits = errors.New("no free units")

// Take claims req.Units units of one instance of one GPU of the layout: the
// first matching GPU, in layout order, with an instance that has them. Units
// of one claim share an instance because one process is one client of one MPS
// server.
func Take(runDir string, lay *pipefile.Layout, req Request) (*Claim, error) {
	if req.Units < 1 {
		return nil, fmt.Errorf("--units must be at least 1, got %d", req.Units)
	}
	var gpus []pipefile.LayoutGPU
	for _, g := range lay.GPUs {
		if pipefile.MatchGPU(req.GPU, g.Index, g.UUID) && pipefile.MatchType(req.Type, g.Name) {
			gpus = append(gpus, g)
		}
	}
	if len(gpus) == 0 {
		return nil, fmt.Errorf("no GPU in the layout matches%s (this node has %s)", describeFilter(req), listGPUs(lay.GPUs))
	}
	var free []string
	for _, g := range gpus {
		gpuFree := 0
		for _, in := range g.Instances {
			c, n, err := takeIn(runDir, g, in, req.Units)
			if err != nil {
				return nil, err
			}
			if c != nil {
				return c, nil
			}
			gpuFree += n
		}
		free = append(free, fmt.Sprintf("GPU %d (%s) %d of %d", g.Index, g.Name, gpuFree, g.UnitsTotal))
	}
	return nil, fmt.Errorf("%w: no instance has %d unit(s) free; free now: %s", ErrNoUnits, req.Units, strings.Join(free, ", "))
}

// takeIn claims n units of instance in of GPU g, or returns how many it found
// free when that is fewer.
func takeIn(runDir string, g pipefile.LayoutGPU, in pipefile.LayoutInstance, n int) (*Claim, int, error) {
	dir, err := pipefile.OpenFolder(pipefile.InstanceDir(runDir, g.UUID, in.Instance))
	if err != nil {
		return nil, 0, explain(err)
	}
	free, err := countFree(dir, in.Units)
	if err != nil || free < n {
		dir.Close()
		return nil, free, err
	}
	// The environment is checked before anything is claimed, so a bad
	// layout leaves nothing behind.
	env, err := pipefile.ScaleEnv(in.Env, g.UUID, n, g.UnitsTotal)
	if err != nil {
		dir.Close()
		return nil, 0, fmt.Errorf("layout: GPU %d instance %d: %w", g.Index, in.Instance, err)
	}
	units, fds, err := claimIn(dir, in.Units, n)
	if err != nil || units == nil {
		// nil units: others took names between the count and the claim.
		dir.Close()
		return nil, 0, err
	}
	return &Claim{GPU: g, Instance: in.Instance, Units: units, FDs: fds, Env: env, dir: dir}, 0, nil
}

// explain adds what to do to a refusal of the ledger's folders: they are open
// to root and gpuletd's socket group only.
func explain(err error) error {
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		return fmt.Errorf("%w (offline claims are open to the members of gpuletd's --socket-group)", err)
	}
	return err
}

func describeFilter(req Request) string {
	var s string
	if req.GPU != "" {
		s += fmt.Sprintf(" --gpu %q", req.GPU)
	}
	if req.Type != "" {
		s += fmt.Sprintf(" --type %q", req.Type)
	}
	return s
}

func listGPUs(gpus []pipefile.LayoutGPU) string {
	if len(gpus) == 0 {
		return "no GPUs"
	}
	var s []string
	for _, g := range gpus {
		s = append(s, fmt.Sprintf("%d %s %s", g.Index, g.UUID, g.Name))
	}
	return strings.Join(s, ", ")
}

// countFree counts the unit names in dir that nothing holds.
func countFree(dir *pipefile.Folder, names []int) (int, error) {
	n := 0
	for _, u := range names {
		_, err := dir.Stat(u)
		switch {
		case errors.Is(err, unix.ENOENT):
			n++
		case err != nil:
			return 0, explain(fmt.Errorf("cannot look at %s/%s: %w", dir.Path(), pipefile.UnitName(u), err))
		}
	}
	return n, nil
}

// claimIn claims n of the unit names in dir, or none (nil) when fewer are free.
func claimIn(dir *pipefile.Folder, names []int, n int) ([]int, []int, error) {
	var units, fds []int
	for _, u := range names {
		if len(units) == n {
			break
		}
		fd, ok, err := dir.Claim(u)
		if err != nil {
			release(dir, units, fds)
			return nil, nil, explain(err)
		}
		if ok {
			units = append(units, u)
			fds = append(fds, fd)
		}
	}
	if len(units) < n {
		release(dir, units, fds)
		return nil, nil, nil
	}
	return units, fds, nil
}

// Release gives the units back, for a claim that will not be used after all
// (the command could not be started).
func (c *Claim) Release() {
	if c.dir == nil {
		return
	}
	release(c.dir, c.Units, c.FDs)
	c.dir.Close()
	c.Units, c.FDs, c.dir = nil, nil, nil
}

func release(dir *pipefile.Folder, units, fds []int) {
	for i, u := range units {
		dir.Unclaim(u, fds[i])
	}
}
