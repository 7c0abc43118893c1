package reserve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/internal/statefile"
)

// FileSchema names the format of the reservations file.
const FileSchema = "gpulet.reservations/v1"

// maxGroups is the kernel's NGROUPS_MAX: no owner had more supplementary
// groups.
const maxGroups = 65536

// FileName is the reservations file's name in the state dir.
const FileName = "reservations.json"

// maxFile bounds what Load reads: far above any real file (a thousand
// reservations of a large node), and it keeps a damaged or foreign file
// from filling the daemon's memory.
const maxFile = 64 << 20

// Record is what the file keeps of one reservation. The leases that draw on
// it or borrow from it are the lease journal's; the file says which units are
// the reservation's, where its workflow stands, and which borrowers are being
// taken back, so that a restart finishes their reclaim.
type Record struct {
	Name string `json:"name"`
	UID  uint32 `json:"uid"`
	GID  uint32 `json:"gid"`
	// Groups are the owner's supplementary groups when it reserved, as the
	// kernel gave them: the reservation's units count toward their quotas
	// after a restart as before it.
	Groups   []uint32  `json:"groups,omitempty"`
	Created  time.Time `json:"created"`
	Needs    []int     `json:"needs"`
	Priority int       `json:"priority"`
	Share    []Member  `json:"share,omitempty"`
	// Active is false while the reservation is pending.
	Active    bool `json:"active"`
	Stage     int  `json:"stage"`
	Reclaimed int  `json:"reclaimed"`
	// Units are the units set aside, per GPU; empty while pending (units
	// held for a pending reservation are not kept: they are held again at
	// start).
	Units []GPUUnits `json:"units,omitempty"`
	// Reclaiming names the borrowed leases being taken back: their holders
	// got SIGTERM and get SIGKILL at KillAt.
	Reclaiming []Reclaiming `json:"reclaiming,omitempty"`
}

// GPUUnits are a reservation's units on the GPU with UUID.
type GPUUnits struct {
	UUID  string `json:"uuid"`
	Units []int  `json:"units"`
}

// Reclaiming is one borrowed lease being taken back.
type Reclaiming struct {
	Lease  string    `json:"lease"`
	KillAt time.Time `json:"kill_at"`
}

// file is the reservations file.
type file struct {
	Schema       string            `json:"schema"`
	Reservations []json.RawMessage `json:"reservations"`
}

// Loaded is what Load found.
type Loaded struct {
	Records []Record
	// Skipped says, per record that could not be used, which and why.
	Skipped []string
}

// ErrDamaged marks a file that cannot be read as a whole: not JSON, another
// schema, too large.
var ErrDamaged = errors.New("reservations file damaged")

// Load reads the reservations file at path; a missing file holds none. A
// record that fails its checks is skipped and named, and the others still
// count. An error wrapping ErrDamaged means nothing in the file could be
// used; any other error, that it could not be read. Symlinks are not
// followed.
func Load(path string) (Loaded, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return Loaded{}, nil
	}
	if err != nil {
		return Loaded{}, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFile+1))
	if err != nil {
		return Loaded{}, err
	}
	return Parse(b)
}

// Parse reads the bytes of a reservations file, as Load does.
func Parse(b []byte) (Loaded, error) {
	if len(b) > maxFile {
		return Loaded{}, fmt.Errorf("%w: larger than %d bytes", ErrDamaged, maxFile)
	}
	var f file
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return Loaded{}, fmt.Errorf("%w: %v", ErrDamaged, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Loaded{}, fmt.Errorf("%w: data after the JSON object", ErrDamaged)
	}
	if f.Schema != FileSchema {
		return Loaded{}, fmt.Errorf("%w: schema %q, not %s", ErrDamaged, f.Schema, FileSchema)
	}
	var out Loaded
	names := map[string]bool{}
	for i, raw := range f.Reservations {
		var r Record
		d := json.NewDecoder(bytes.NewReader(raw))
		d.DisallowUnknownFields()
		err := d.Decode(&r)
		if err == nil {
			err = r.check()
		}
		if err == nil && names[r.Name] {
			err = errors.New("a second reservation of that name")
		}
		if err != nil {
			out.Skipped = append(out.Skipped, fmt.Sprintf("record %d (%s): %v", i, nameHint(r.Name), err))
			continue
		}
		names[r.Name] = true
		out.Records = append(out.Records, r)
	}
	return out, nil
}

func nameHint(name string) string {
	if CheckName(name) != nil {
		return "no valid name"
	}
	return strconv.Quote(name)
}

// check holds a record to what the daemon could have written.
func (r *Record) check() error {
	if err := CheckName(r.Name); err != nil {
		return err
	}
	if len(r.Needs) == 0 || len(r.Needs) > MaxStages {
		return fmt.Errorf("%d stages", len(r.Needs))
	}
	for i, n := range r.Needs {
		if n < 1 || n > maxJobUnits*MaxJobsPerStage {
			return fmt.Errorf("stage %d needs %d units", i, n)
		}
	}
	if r.Priority < -MaxPriority || r.Priority > MaxPriority {
		return fmt.Errorf("priority %d", r.Priority)
	}
	if r.Stage < 0 || r.Stage >= len(r.Needs) {
		return fmt.Errorf("stage %d of %d", r.Stage, len(r.Needs))
	}
	if r.Reclaimed < 0 {
		return fmt.Errorf("reclaimed %d", r.Reclaimed)
	}
	if len(r.Groups) > maxGroups {
		return fmt.Errorf("%d groups", len(r.Groups))
	}
	if len(r.Share) > MaxMembers {
		return fmt.Errorf("%d share members", len(r.Share))
	}
	weighted := Weighted(r.Share)
	for i, m := range r.Share {
		if m.Name == "" || (m.Weight > 0) != weighted || m.Weight < 0 || m.Weight > MaxWeight {
			return fmt.Errorf("share member %d", i)
		}
	}
	if !r.Active && (len(r.Units) > 0 || len(r.Reclaiming) > 0) {
		return errors.New("a pending reservation with units")
	}
	seen := map[string]bool{}
	for _, g := range r.Units {
		if g.UUID == "" || seen[g.UUID] {
			return fmt.Errorf("GPU %q listed twice or unnamed", g.UUID)
		}
		seen[g.UUID] = true
		if !slices.IsSorted(g.Units) || len(slices.Compact(slices.Clone(g.Units))) != len(g.Units) {
			return fmt.Errorf("units of GPU %s not in order or repeated", g.UUID)
		}
		for _, u := range g.Units {
			if u < 0 {
				return fmt.Errorf("unit %d", u)
			}
		}
	}
	return nil
}

// Save writes recs to path so that they survive a crash and a power loss
// (statefile.Write); when it fails the old file stays as it was.
func Save(path string, recs []Record) error {
	f := struct {
		Schema       string   `json:"schema"`
		Reservations []Record `json:"reservations"`
	}{FileSchema, recs}
	if f.Reservations == nil {
		f.Reservations = []Record{}
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	return statefile.Write(path, append(b, '\n'), 0o600)
}
