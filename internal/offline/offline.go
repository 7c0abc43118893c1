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
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/pipefile"
)

// Request says what to claim.
type Request struct {
	Units int
	// GPU is an index or UUID; empty: any.
	GPU string
	// Type is a case-insensitive substring of the GPU's name; empty: any.
	Type string
	// UID is the claimer's: with MPS, an instance that serves another user
	// is passed by, since the claimer's process would wait there until that
	// user's processes end.
	UID uint32
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

// ErrNoDaemon means MPS is on and gpuletd is not running: nothing says whom
// the MPS servers it left up serve.
var ErrNoDaemon = errors.New("gpuletd is not running")

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
		if api.MatchGPU(req.GPU, g.Index, g.UUID) && api.MatchType(req.Type, g.Name) {
			gpus = append(gpus, g)
		}
	}
	if len(gpus) == 0 {
		return nil, fmt.Errorf("no GPU in the layout matches%s (this node has %s)", describeFilter(req), listGPUs(lay.GPUs))
	}
	// A claim lies on one instance: more units than any instance has can
	// never be claimed, however many are free.
	largest := 0
	for _, g := range gpus {
		for _, in := range g.Instances {
			largest = max(largest, len(in.Units))
		}
	}
	if req.Units > largest {
		return nil, fmt.Errorf("%w: %d unit(s) can never be claimed at once: a claim lies on one MPS instance, and none here has more than %d unit(s)", ErrNoUnits, req.Units, largest)
	}
	users, err := pipefile.ReadUsers(runDir)
	if err != nil {
		return nil, err
	}
	if users == nil && mpsOn(gpus) {
		// gpuletd leaves busy MPS servers up when it stops, and its users
		// file goes with it: a claim could land on an instance whose server
		// serves another user's job, and wait there until that job ends.
		return nil, fmt.Errorf("%w (no %s written by a live gpuletd): with MPS on, an offline claim cannot tell which instances serve another user's jobs, and a process on one would wait until they end; claim once gpuletd runs again", ErrNoDaemon, pipefile.UsersFile)
	}
	var free, others []string
	// The first refusal, returned when no matching folder let the claimer in.
	var refused error
	opened := false
	for _, g := range gpus {
		gpuFree, closed := 0, 0
		for _, in := range g.Instances {
			c, n, other, err := takeIn(runDir, g, in, req, users.Of(g.UUID, in.Instance), users.SurplusOf(g.UUID, in.Instance))
			if isRefusal(err) {
				// The folders of a GPU in a pool that leaves the claimer
				// out are closed to it: passed by, like a full one, so
				// that a claim naming no GPU goes where it may.
				refused = cmp.Or(refused, err)
				closed++
				continue
			}
			if err != nil {
				return nil, err
			}
			if c != nil {
				return c, nil
			}
			opened = true
			gpuFree += n
			if other != "" {
				others = append(others, other)
			}
		}
		if closed > 0 && closed == len(g.Instances) {
			free = append(free, fmt.Sprintf("GPU %d (%s) closed to you", g.Index, g.Name))
			continue
		}
		free = append(free, fmt.Sprintf("GPU %d (%s) %d of %d", g.Index, g.Name, gpuFree, g.UnitsTotal))
	}
	if refused != nil && !opened {
		return nil, refused
	}
	if len(others) > 0 {
		return nil, fmt.Errorf("%w: no instance that serves only uid %d has %d unit(s) free; %s (an MPS server serves one user at a time: a process there would wait until theirs end)",
			ErrNoUnits, req.UID, req.Units, strings.Join(others, "; "))
	}
	return nil, fmt.Errorf("%w: no instance has %d unit(s) free; free now: %s", ErrNoUnits, req.Units, strings.Join(free, ", "))
}

// mpsOn says whether the layout's instances run under MPS: their
// environment names an MPS pipe folder.
func mpsOn(gpus []pipefile.LayoutGPU) bool {
	for _, g := range gpus {
		for _, in := range g.Instances {
			if in.Env[pipefile.EnvPipeDirectory] != "" {
				return true
			}
		}
	}
	return false
}

// takeIn claims req.Units units of instance in of GPU g, or returns how many
// it found free when that is fewer. served is whom users.json says the
// instance serves, surplus the users whose claims there keep nobody off. With
// MPS, an instance with room that serves another user is passed by, and
// other says so.
func takeIn(runDir string, g pipefile.LayoutGPU, in pipefile.LayoutInstance, req Request, served, surplus []uint32) (c *Claim, free int, other string, err error) {
	n := req.Units
	dir, err := pipefile.OpenFolder(pipefile.InstanceDir(runDir, g.UUID, in.Instance))
	if err != nil {
		return nil, 0, "", explain(err)
	}
	free, claimers, err := look(dir, in.Units)
	if err != nil || free < n {
		dir.Close()
		return nil, free, "", err
	}
	if in.Env[pipefile.EnvPipeDirectory] != "" {
		claimers = slices.DeleteFunc(claimers, func(uid uint32) bool { return slices.Contains(surplus, uid) })
		if uids := othersThan(req.UID, served, claimers); len(uids) > 0 {
			dir.Close()
			return nil, 0, fmt.Sprintf("GPU %d instance %d has %d free but serves uid %s", g.Index, in.Instance, free, joinUIDs(uids)), nil
		}
	}
	// The environment is checked before anything is claimed, so a bad
	// layout leaves nothing behind.
	env, err := pipefile.ScaleEnv(in.Env, g.UUID, n, g.UnitsTotal)
	if err != nil {
		dir.Close()
		return nil, 0, "", fmt.Errorf("layout: GPU %d instance %d: %w", g.Index, in.Instance, err)
	}
	units, fds, err := claimIn(dir, in.Units, n)
	if err != nil || units == nil {
		// nil units: others took names between the count and the claim.
		dir.Close()
		return nil, 0, "", err
	}
	return &Claim{GPU: g, Instance: in.Instance, Units: units, FDs: fds, Env: env, dir: dir}, 0, "", nil
}

// isRefusal says whether err is the ledger refusing the claimer a folder.
func isRefusal(err error) bool {
	return errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM)
}

// explain adds what to do to a refusal of the ledger's folders: they are open
// to root and gpuletd's socket group only.
func explain(err error) error {
	if isRefusal(err) {
		return fmt.Errorf("%w (offline claims are open to the members of gpuletd's --socket-group, gpulet by default: sudo usermod -aG gpulet $USER, then log in again)", err)
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

// look counts the unit names in dir that nothing holds, and lists the owners
// of the offline claims there: the FIFOs that the folder's owner, gpuletd, did
// not make. They are the claims too new for users.json.
func look(dir *pipefile.Folder, names []int) (free int, claimers []uint32, err error) {
	daemon, err := dir.Owner()
	if err != nil {
		return 0, nil, explain(err)
	}
	for _, u := range names {
		st, err := dir.Stat(u)
		switch {
		case errors.Is(err, unix.ENOENT):
			free++
		case errors.Is(err, unix.EACCES):
			// The folder opened, so this is something at the name that no
			// other user may look at (a user's FUSE mount, which gpuletd
			// removes): not free and no claim; the other names still count.
		case err != nil:
			return 0, nil, explain(fmt.Errorf("cannot look at %s/%s: %w", dir.Path(), pipefile.UnitName(u), err))
		case pipefile.IsFIFO(&st) && st.Uid != daemon:
			claimers = append(claimers, st.Uid)
		}
	}
	return free, claimers, nil
}

// othersThan lists, ascending and each once, the uids of served and claimers
// that are not uid.
func othersThan(uid uint32, served, claimers []uint32) []uint32 {
	var out []uint32
	for _, u := range slices.Concat(served, claimers) {
		if u != uid {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func joinUIDs(uids []uint32) string {
	s := make([]string, len(uids))
	for i, u := range uids {
		s[i] = strconv.FormatUint(uint64(u), 10)
	}
	return strings.Join(s, ", ")
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
