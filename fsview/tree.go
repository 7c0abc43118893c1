package fsview

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/snapshot"
)

// This file is the whole layout of the view (docs/design.md §9) as pure
// functions of one snapshot: which names exist, what kind they are and what
// bytes a reader gets. The FUSE side only asks it questions.

// kind is what a name of the view is.
type kind uint8

const (
	kindFile kind = iota + 1
	kindDir
	kindLink
)

// entry is one name of the view as one snapshot shows it.
type entry struct {
	kind kind
	// data is a file's bytes or a link's target.
	data []byte
	// perm holds the permission bits; uid and gid own the entry.
	perm     uint32
	uid, gid uint32
	// static names exist whenever their directory does (the layout's fixed
	// names), so the kernel may cache them; the others come and go with GPUs
	// and leases.
	static bool
}

// dirent is one name of a directory listing.
type dirent struct {
	name string
	kind kind
}

// rootNames lists the root in the order the layout gives it.
var rootNames = []dirent{
	{"free_units", kindFile},
	{"total_units", kindFile},
	{"reserved_units", kindFile},
	{"state", kindFile},
	{"snapshot.json", kindFile},
	{"metrics", kindFile},
	{"gpus", kindDir},
	{"leases", kindDir},
	{"reservations", kindDir},
}

// gpuNames lists gpus/<index>/.
var gpuNames = []dirent{
	{"uuid", kindFile},
	{"name", kindFile},
	{"state", kindFile},
	{"eligible", kindFile},
	{"units_total", kindFile},
	{"units_used", kindFile},
	{"units_free", kindFile},
	{"units_offline", kindFile},
	{"units_reserved", kindFile},
	{"utilization_pct", kindFile},
	{"kernel_time_pct", kindFile},
	{"memory_used_mib", kindFile},
	{"memory_held_mib", kindFile},
	{"memory_total_mib", kindFile},
	{"outside_memory_mib", kindFile},
}

var (
	staticDir = entry{kind: kindDir, perm: 0o555, static: true}
	// dynamicDir is gpus/<index>: its name goes away with the GPU.
	dynamicDir = entry{kind: kindDir, perm: 0o555}
)

// current returns the snapshot of p; nil while the daemon has published none.
func current(p *snapshot.Published) *api.Snapshot {
	if p == nil {
		return nil
	}
	return p.Snapshot
}

// lookup resolves a slash-separated path relative to the root ("" is the root)
// in p. A nil p (nothing published yet) still has the root files, with no bytes,
// and empty gpus and leases.
func lookup(p *snapshot.Published, path string) (entry, bool) {
	if path == "" {
		return staticDir, true
	}
	first, rest, nested := strings.Cut(path, "/")
	switch first {
	case "gpus":
		if !nested {
			return staticDir, true
		}
		return lookupGPU(current(p), rest)
	case "leases":
		if !nested {
			return staticDir, true
		}
		return lookupLease(p, rest)
	case "reservations":
		if !nested {
			return staticDir, true
		}
		return lookupReservation(current(p), rest)
	}
	if nested {
		return entry{}, false
	}
	return lookupRoot(p, first)
}

func lookupRoot(p *snapshot.Published, name string) (entry, bool) {
	s := current(p)
	e := entry{kind: kindFile, perm: 0o444, static: true}
	switch name {
	case "free_units":
		if s != nil {
			e.data = intLine(int64(s.UnitsFree))
		}
	case "total_units":
		if s != nil {
			e.data = intLine(int64(s.UnitsTotal))
		}
	case "reserved_units":
		if s != nil {
			e.data = intLine(int64(s.UnitsReserved))
		}
	case "state":
		if s != nil {
			e.data = stringLine(s.State)
		}
	case "snapshot.json":
		if s != nil {
			e.data = p.JSON()
		}
	case "metrics":
		if s != nil {
			e.data = p.Metrics()
		}
	default:
		return entry{}, false
	}
	return e, true
}

// lookupGPU resolves a path below gpus/.
func lookupGPU(s *api.Snapshot, path string) (entry, bool) {
	if s == nil {
		return entry{}, false
	}
	name, file, nested := strings.Cut(path, "/")
	g, link := findGPU(s, name)
	switch {
	case g == nil:
		return entry{}, false
	case link:
		if nested {
			// The kernel resolves paths through the symlink itself.
			return entry{}, false
		}
		return entry{kind: kindLink, data: []byte(strconv.Itoa(g.Index)), perm: 0o777}, true
	case !nested:
		return dynamicDir, true
	}
	data, ok := gpuFile(g, file)
	if !ok {
		return entry{}, false
	}
	return entry{kind: kindFile, data: data, perm: 0o444, static: true}, true
}

// findGPU finds the GPU named name below gpus/: by index (a directory) first,
// else by UUID (a symlink). Duplicates resolve to the first GPU, as in listGPUs.
func findGPU(s *api.Snapshot, name string) (g *api.GPU, link bool) {
	for i := range s.GPUs {
		if strconv.Itoa(s.GPUs[i].Index) == name {
			return &s.GPUs[i], false
		}
	}
	if !validName(name) {
		return nil, false
	}
	for i := range s.GPUs {
		if s.GPUs[i].UUID == name {
			return &s.GPUs[i], true
		}
	}
	return nil, false
}

func gpuFile(g *api.GPU, name string) ([]byte, bool) {
	switch name {
	case "uuid":
		return stringLine(g.UUID), true
	case "name":
		return stringLine(g.Name), true
	case "state":
		return stringLine(g.State), true
	case "eligible":
		return stringLine(strconv.FormatBool(g.Eligible)), true
	case "units_total":
		return intLine(int64(g.UnitsTotal)), true
	case "units_used":
		return intLine(int64(g.UnitsUsed)), true
	case "units_free":
		return intLine(int64(g.UnitsFree)), true
	case "units_offline":
		return intLine(int64(g.UnitsOffline)), true
	case "units_reserved":
		return intLine(int64(g.UnitsReserved)), true
	case "utilization_pct":
		return intLine(int64(g.UtilizationPct)), true
	case "kernel_time_pct":
		return intLine(int64(g.KernelTimePct)), true
	case "outside_memory_mib":
		return uintLine(g.OutsideMemoryMiB), true
	case "memory_used_mib":
		return uintLine(g.MemoryUsedMiB), true
	case "memory_held_mib":
		return uintLine(g.MemoryHeldMiB), true
	case "memory_total_mib":
		return uintLine(g.MemoryTotalMiB), true
	}
	return nil, false
}

// lookupLease resolves leases/<id>: the lease's JSON, readable by its owner only.
func lookupLease(p *snapshot.Published, id string) (entry, bool) {
	if p == nil || !validName(id) {
		return entry{}, false
	}
	l, ok := p.Lease(id)
	if !ok {
		return entry{}, false
	}
	b, err := json.Marshal(l)
	if err != nil {
		// Unreachable for a lease the daemon has already served as JSON.
		return entry{}, false
	}
	return entry{
		kind: kindFile,
		data: append(b, '\n'),
		perm: 0o400,
		uid:  l.Owner.UID,
		gid:  l.Owner.GID,
	}, true
}

// lookupReservation resolves reservations/<name>: where the reservation
// stands, as the snapshot shows it (JSON), readable by all as the snapshot is.
func lookupReservation(s *api.Snapshot, name string) (entry, bool) {
	if s == nil || !validName(name) {
		return entry{}, false
	}
	for _, r := range s.Reservations {
		if r.Name != name {
			continue
		}
		b, err := json.Marshal(r)
		if err != nil {
			// Unreachable: the snapshot holding it was encoded already.
			return entry{}, false
		}
		return entry{kind: kindFile, data: append(b, '\n'), perm: 0o444}, true
	}
	return entry{}, false
}

// list returns the names of the directory at path in a stable order, and false
// if path is not a directory in p.
func list(p *snapshot.Published, path string) ([]dirent, bool) {
	switch path {
	case "":
		return rootNames, true
	case "gpus":
		return listGPUs(current(p)), true
	case "leases":
		return listLeases(p), true
	case "reservations":
		return listReservations(current(p)), true
	}
	if e, ok := lookup(p, path); !ok || e.kind != kindDir {
		return nil, false
	}
	// The only other directories are gpus/<index>.
	return gpuNames, true
}

func listGPUs(s *api.Snapshot) []dirent {
	if s == nil {
		return []dirent{}
	}
	out := make([]dirent, 0, 2*len(s.GPUs))
	seen := make(map[string]bool, 2*len(s.GPUs))
	for _, g := range s.GPUs {
		if name := strconv.Itoa(g.Index); !seen[name] {
			seen[name] = true
			out = append(out, dirent{name, kindDir})
		}
	}
	for _, g := range s.GPUs {
		if validName(g.UUID) && !seen[g.UUID] {
			seen[g.UUID] = true
			out = append(out, dirent{g.UUID, kindLink})
		}
	}
	return out
}

func listLeases(p *snapshot.Published) []dirent {
	if p == nil {
		return []dirent{}
	}
	leases := p.Leases()
	out := make([]dirent, 0, len(leases))
	seen := make(map[string]bool, len(leases))
	for _, l := range leases {
		if validName(l.ID) && !seen[l.ID] {
			seen[l.ID] = true
			out = append(out, dirent{l.ID, kindFile})
		}
	}
	return out
}

func listReservations(s *api.Snapshot) []dirent {
	if s == nil {
		return []dirent{}
	}
	out := make([]dirent, 0, len(s.Reservations))
	seen := make(map[string]bool, len(s.Reservations))
	for _, r := range s.Reservations {
		if validName(r.Name) && !seen[r.Name] {
			seen[r.Name] = true
			out = append(out, dirent{r.Name, kindFile})
		}
	}
	return out
}

// render returns the bytes a reader of the file at path gets from p, and false
// if there is no such file.
func render(p *snapshot.Published, path string) ([]byte, bool) {
	e, ok := lookup(p, path)
	if !ok || e.kind != kindFile {
		return nil, false
	}
	return e.data, true
}

// validName reports whether a name taken from the snapshot (a UUID, a lease ID)
// can be a single path component; others are left out of the view.
func validName(s string) bool {
	return s != "" && s != "." && s != ".." && len(s) <= 255 && !strings.ContainsAny(s, "/\x00")
}

func intLine(v int64) []byte   { return append(strconv.AppendInt(make([]byte, 0, 21), v, 10), '\n') }
func uintLine(v uint64) []byte { return append(strconv.AppendUint(make([]byte, 0, 21), v, 10), '\n') }
func stringLine(s string) []byte {
	return append(append(make([]byte, 0, len(s)+1), s...), '\n')
}
