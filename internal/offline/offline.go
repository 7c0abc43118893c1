// Package offline claims units without gpuletd, by the pipe-file protocol of
// DESIGN section 5: a FIFO made under a temporary name, locked, then linked to
// unit-<i>. The locks are held by descriptors that survive exec, so a claim
// lives exactly as long as the process that made it (and what it execs).
//
// It reads layout.json but never writes it, and it keeps no record of claims:
// the ledger's folders are the record, and gpuletd counts what is there.
package offline

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"math/rand/v2"
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
			return nil, fmt.Errorf("no pipe-file ledger at %s: gpuletd has never run with this run dir (start it once, or point --run-dir or %s at its run dir)", path, RunDirEnv)
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

// DecodeLayout parses layout.json and checks what a claim relies on: the known
// schema, UUIDs that are one path element (they become folder names), unit
// indices inside units_total and owned by one instance only.
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
		owned := map[int]bool{}
		for _, in := range g.Instances {
			if in.Instance < 0 {
				return nil, fmt.Errorf("layout: GPU %d has instance %d", g.Index, in.Instance)
			}
			for _, u := range in.Units {
				if u < 0 || u >= g.UnitsTotal {
					return nil, fmt.Errorf("layout: GPU %d instance %d has unit %d outside 0..%d", g.Index, in.Instance, u, g.UnitsTotal-1)
				}
				if owned[u] {
					return nil, fmt.Errorf("layout: GPU %d has unit %d in two instances", g.Index, u)
				}
				owned[u] = true
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

// Claim is a set of held units of one instance of one GPU.
type Claim struct {
	GPU      ledger.LayoutGPU
	Instance int
	Units    []int
	// FDs hold the locks, one per unit. They are not close-on-exec: the
	// command gpurun execs inherits them and so holds the claim.
	FDs []int
	// Env is what the process runs with: the instance's environment from
	// layout.json, scaled to len(Units).
	Env map[string]string

	dir string
}

// ErrNoUnits means no instance of a matching GPU had enough free unit names.
var ErrNoUnits = errors.New("no free units")

// Take claims req.Units units of one instance of one GPU of the layout: the
// first matching GPU, in layout order, with an instance that has them. Units
// of one claim share an instance because one process is one client of one MPS
// server.
func Take(runDir string, lay *ledger.Layout, req Request) (*Claim, error) {
	if req.Units < 1 {
		return nil, fmt.Errorf("--units must be at least 1, got %d", req.Units)
	}
	var gpus []ledger.LayoutGPU
	for _, g := range lay.GPUs {
		if matches(g, req) {
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
			dir := filepath.Join(runDir, "units", g.UUID, strconv.Itoa(in.Instance))
			n := countFree(dir, in.Units)
			gpuFree += n
			if n < req.Units {
				continue
			}
			// The environment is checked before anything is claimed, so a bad
			// layout leaves nothing behind.
			env, err := ScaleEnv(in.Env, g.UUID, req.Units, g.UnitsTotal)
			if err != nil {
				return nil, fmt.Errorf("layout: GPU %d instance %d: %w", g.Index, in.Instance, err)
			}
			units, fds, err := claimIn(dir, in.Units, req.Units)
			if err != nil {
				return nil, err
			}
			if units == nil {
				// Others took names between the count and the claim.
				continue
			}
			return &Claim{GPU: g, Instance: in.Instance, Units: units, FDs: fds, Env: env, dir: dir}, nil
		}
		free = append(free, fmt.Sprintf("GPU %d (%s) %d of %d", g.Index, g.Name, gpuFree, g.UnitsTotal))
	}
	return nil, fmt.Errorf("%w: no instance has %d unit(s) free; free now: %s", ErrNoUnits, req.Units, strings.Join(free, ", "))
}

func matches(g ledger.LayoutGPU, req Request) bool {
	if req.GPU != "" {
		if n, err := strconv.Atoi(req.GPU); err == nil {
			if n != g.Index {
				return false
			}
		} else if !strings.EqualFold(req.GPU, g.UUID) {
			return false
		}
	}
	return req.Type == "" || strings.Contains(strings.ToLower(g.Name), strings.ToLower(req.Type))
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

func listGPUs(gpus []ledger.LayoutGPU) string {
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
func countFree(dir string, names []int) int {
	n := 0
	for _, u := range names {
		var st unix.Stat_t
		if errors.Is(unix.Lstat(filepath.Join(dir, ledger.UnitName(u)), &st), unix.ENOENT) {
			n++
		}
	}
	return n
}

// claimIn claims n of the unit names in dir, or none (nil) when fewer are free.
func claimIn(dir string, names []int, n int) ([]int, []int, error) {
	var units, fds []int
	undo := func() {
		release(dir, units, fds)
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
	tmp, err := makeTempFIFO(dir)
	if err != nil {
		return -1, false, err
	}
	// The temporary name goes in every case: after a link the unit name holds
	// the FIFO, and otherwise nothing should.
	defer unix.Unlink(tmp)
	// No O_CLOEXEC: the lock must outlive exec into the command. O_RDWR opens
	// a FIFO without waiting for a peer.
	fd, err = unix.Open(tmp, unix.O_RDWR|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, false, fmt.Errorf("cannot open claim FIFO %s: %w", tmp, err)
	}
	// The FIFO is locked before it has a unit name, so that gpuletd never sees
	// the claim unlocked and takes it for stale.
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		return -1, false, fmt.Errorf("cannot lock claim FIFO %s: %w", tmp, err)
	}
	err = unix.Link(tmp, filepath.Join(dir, ledger.UnitName(u)))
	if errors.Is(err, unix.EEXIST) {
		unix.Close(fd)
		return -1, false, nil
	}
	if err != nil {
		unix.Close(fd)
		return -1, false, fmt.Errorf("cannot link claim to %s: %w", ledger.UnitName(u), err)
	}
	return fd, true, nil
}

// makeTempFIFO makes a FIFO under a fresh name starting with "." in dir, which
// gpuletd ignores. A random part keeps names of claimers apart, including a
// dead one's leftover under a pid now reused.
func makeTempFIFO(dir string) (string, error) {
	for range 16 {
		tmp := filepath.Join(dir, fmt.Sprintf(".claim-%d-%08x", os.Getpid(), rand.Uint32()))
		err := unix.Mkfifo(tmp, 0o600)
		if err == nil {
			return tmp, nil
		}
		if !errors.Is(err, unix.EEXIST) {
			return "", fmt.Errorf("cannot make a claim FIFO in %s: %w", dir, err)
		}
	}
	return "", fmt.Errorf("cannot make a claim FIFO in %s: every name tried exists", dir)
}

// Release gives the units back, for a claim that will not be used after all
// (the command could not be started). Each name is removed while its lock is
// still held, so gpuletd never counts it stale meanwhile.
func (c *Claim) Release() {
	release(c.dir, c.Units, c.FDs)
	c.Units, c.FDs = nil, nil
}

func release(dir string, units, fds []int) {
	for i, u := range units {
		unix.Unlink(filepath.Join(dir, ledger.UnitName(u)))
		unix.Close(fds[i])
	}
}

// Variables of layout.json's environment that depend on the number of units.
const (
	threadPctEnv = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	memLimitEnv  = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	visibleEnv   = "CUDA_VISIBLE_DEVICES"
)

// ScaleEnv turns layout.json's one-unit environment of an instance into that of
// n of the GPU's total units: the thread percentage becomes ceil(100·n/total),
// as gpuletd gives a lease, and a pinned memory limit is multiplied by n.
// CUDA_VISIBLE_DEVICES is the GPU's UUID if the layout does not say.
func ScaleEnv(env map[string]string, uuid string, n, total int) (map[string]string, error) {
	out := make(map[string]string, len(env)+2)
	for k, v := range env {
		out[k] = v
	}
	if out[visibleEnv] == "" {
		out[visibleEnv] = uuid
	}
	out[threadPctEnv] = strconv.Itoa((100*n + total - 1) / total)
	if v, ok := env[memLimitEnv]; ok {
		scaled, err := ScaleMemLimit(v, n)
		if err != nil {
			return nil, err
		}
		out[memLimitEnv] = scaled
	}
	return out, nil
}

// ScaleMemLimit multiplies every limit of a CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
// value ("0=5120M", or "0=1G,1=512M") by n, keeping each limit's unit.
func ScaleMemLimit(v string, n int) (string, error) {
	if n < 1 {
		return "", fmt.Errorf("%s: cannot scale to %d units", memLimitEnv, n)
	}
	bad := fmt.Errorf("%s %q: want DEVICE=SIZE entries such as 0=5120M", memLimitEnv, v)
	entries := strings.Split(v, ",")
	for i, e := range entries {
		dev, size, ok := strings.Cut(e, "=")
		if !ok || !allDigits(dev) {
			return "", bad
		}
		end := 0
		for end < len(size) && size[end] >= '0' && size[end] <= '9' {
			end++
		}
		num, err := strconv.ParseUint(size[:end], 10, 64)
		if err != nil || !allLetters(size[end:]) {
			return "", bad
		}
		hi, scaled := bits.Mul64(num, uint64(n))
		if hi != 0 {
			return "", fmt.Errorf("%s %q: %d times it is too large", memLimitEnv, v, n)
		}
		entries[i] = dev + "=" + strconv.FormatUint(scaled, 10) + size[end:]
	}
	return strings.Join(entries, ","), nil
}

func allDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

func allLetters(s string) bool {
	for _, r := range s {
		if (r < 'A' || r > 'Z') && (r < 'a' || r > 'z') {
			return false
		}
	}
	return true
}
