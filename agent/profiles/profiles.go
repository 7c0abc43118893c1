// Package profiles keeps the task–engine affinity table (docs/design.md
// §1.9): per task, its run time on each GPU model. The config file's
// entries are the starting point; every run the daemon measures (a lease with
// a task whose process exited) moves the task's time on that model by an
// exponentially weighted mean. Measured entries are kept in the state dir,
// written with fsync, so that they survive restarts and reboots.
//
// Readers never lock: each change publishes an immutable table, and a
// request's preference (Prefer) is a lookup in it.
package profiles

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/statefile"
)

// Weight is the weight of a new run in the mean: 0.3 follows a task whose
// run time shifts (new data, new code) within a few runs, while one odd run
// moves the mean by less than a third of its difference.
const Weight = 0.3

// Limits on what measured runs can make the store keep: a task name comes
// from any caller, so a flood of names must not grow the file without end.
const (
	MaxTasks = 4096
	// MaxTasksPerUID bounds the tasks one uid (root aside) brings into the
	// table, so that no user can fill it for the others.
	MaxTasksPerUID   = 256
	MaxModelsPerTask = 64
	maxFileBytes     = 16 << 20
	fileSchema       = "gpulet.profiles/v1"
	fileName         = "profiles.json"
	stateFileMode    = 0o644
)

// Entry is one task's run time on one GPU model.
type Entry struct {
	// Mean is the run time: the config's figure, moved by each measured run.
	Mean time.Duration
	// Runs counts the measured runs it rests on (0: the config's figure only).
	Runs int
}

// Table is the affinity table at one moment: task → GPU model name → entry.
// It is never modified once published.
type Table struct {
	Tasks map[string]map[string]Entry
	// prefer lists per task its models, fastest first.
	prefer map[string][]string
}

// Prefer lists the GPU models task runs on, fastest first; nil for a task
// the table does not know.
func (t *Table) Prefer(task string) []string { return t.prefer[task] }

// Store is the table, its seeds from the config, and its file.
type Store struct {
	path string
	// mu serializes changes and writes of the file; readers use table.
	mu       sync.Mutex
	seeds    map[string]map[string]time.Duration
	measured map[string]map[string]Entry
	// owner is, per measured task, the uid whose run brought it in; started
	// counts those per uid (MaxTasksPerUID).
	owner   map[string]uint32
	started map[uint32]int
	table   atomic.Pointer[Table]
}

// Open loads the measured runs kept in dir (none yet: an empty table). A
// file that cannot be read is an error. One that does not parse is set aside
// (profiles.json.damaged), so that the runs it held are not written over,
// and the table starts from the config's figures alone: log says so.
func Open(dir string, log *slog.Logger) (*Store, error) {
	s := &Store{path: filepath.Join(dir, fileName), measured: map[string]map[string]Entry{}, owner: map[string]uint32{}, started: map[uint32]int{}}
	b, err := readBounded(s.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("task profiles: %w", err)
	default:
		m, owners, err := decode(b)
		if err == nil {
			s.measured = m
			for task, uid := range owners {
				s.owner[task] = uid
				s.started[uid]++
			}
			break
		}
		aside, serr := statefile.SetAside(s.path)
		if serr != nil {
			return nil, fmt.Errorf("task profiles %s: %w; and it cannot be set aside: %v", s.path, err, serr)
		}
		log.Error("task profiles file is damaged: set aside, measured run times start over", "file", s.path, "set_aside_as", aside, "err", err)
	}
	s.publishLocked()
	return s, nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > maxFileBytes {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d a profile file may have", path, st.Size(), maxFileBytes)
	}
	return os.ReadFile(path)
}

// fileFormat is the file: measured entries only (the config's seeds stay in
// the config), run times in seconds.
type fileFormat struct {
	Schema string                          `json:"schema"`
	Tasks  map[string]map[string]fileEntry `json:"tasks"`
	// Owners names, per task, the uid whose run brought it into the table.
	Owners map[string]uint32 `json:"owners,omitempty"`
}

type fileEntry struct {
	Seconds float64 `json:"seconds"`
	Runs    int     `json:"runs"`
}

func decode(b []byte) (map[string]map[string]Entry, map[string]uint32, error) {
	var f fileFormat
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, nil, err
	}
	if f.Schema != fileSchema {
		return nil, nil, fmt.Errorf("schema %q, want %q", f.Schema, fileSchema)
	}
	if len(f.Tasks) > MaxTasks {
		return nil, nil, fmt.Errorf("%d tasks, more than %d", len(f.Tasks), MaxTasks)
	}
	out := make(map[string]map[string]Entry, len(f.Tasks))
	for task, models := range f.Tasks {
		if task == "" || len(models) > MaxModelsPerTask {
			return nil, nil, fmt.Errorf("task %q: empty name or more than %d models", task, MaxModelsPerTask)
		}
		out[task] = make(map[string]Entry, len(models))
		for model, e := range models {
			mean := time.Duration(e.Seconds * float64(time.Second))
			if model == "" || !(e.Seconds > 0) || e.Seconds > maxSeconds || mean <= 0 || e.Runs < 1 {
				return nil, nil, fmt.Errorf("task %q model %q: run time %gs over %d runs is not a measured run", task, model, e.Seconds, e.Runs)
			}
			out[task][model] = Entry{Mean: mean, Runs: e.Runs}
		}
	}
	for task := range f.Owners {
		if _, ok := out[task]; !ok {
			return nil, nil, fmt.Errorf("owners: task %q has no measured runs", task)
		}
	}
	return out, f.Owners, nil
}

// maxSeconds keeps a run time within time.Duration.
const maxSeconds = 1e9

// Seed puts the config file's run times in place (a start or a reload): a
// task's measured runs start from its seed, and a task without measured runs
// is its seed.
func (s *Store) Seed(seeds map[string]map[string]time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seeds = seeds
	s.publishLocked()
}

// Record adds one measured run of task on model, by a lease of uid, and
// writes the file. A task or model past the limits is left out (and said
// so); a write that fails keeps the run in memory and returns the error.
func (s *Store) Record(task, model string, uid uint32, ran time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	models, ok := s.measured[task]
	if !ok {
		if len(s.measured) >= MaxTasks {
			return fmt.Errorf("task profiles: %d tasks kept already; run of %q left out", MaxTasks, task)
		}
		if uid != 0 && s.started[uid] >= MaxTasksPerUID {
			return fmt.Errorf("task profiles: uid %d brought %d tasks in already, the most one user may; run of %q left out", uid, MaxTasksPerUID, task)
		}
		models = map[string]Entry{}
		s.measured[task] = models
		s.owner[task] = uid
		s.started[uid]++
	}
	e, ok := models[model]
	if !ok {
		if len(models) >= MaxModelsPerTask {
			return fmt.Errorf("task profiles: task %q has %d models already; run on %q left out", task, MaxModelsPerTask, model)
		}
		if seed, ok := s.seeds[task][model]; ok {
			e.Mean = seed
		} else {
			e.Mean = ran
		}
	}
	e.Mean = time.Duration((1-Weight)*float64(e.Mean) + Weight*float64(ran))
	e.Runs++
	models[model] = e
	// Written before it is shown: what GET /v1/profiles shows survives a
	// restart. A run that cannot be written is still shown and used.
	err := s.writeLocked()
	s.publishLocked()
	return err
}

// Table returns the table as last published.
func (s *Store) Table() *Table { return s.table.Load() }

// Prefer lists the GPU models task runs on, fastest first.
func (s *Store) Prefer(task string) []string { return s.table.Load().Prefer(task) }

// publishLocked merges seeds and measured runs into a new Table.
func (s *Store) publishLocked() {
	t := &Table{Tasks: map[string]map[string]Entry{}, prefer: map[string][]string{}}
	for task, models := range s.seeds {
		t.Tasks[task] = map[string]Entry{}
		for model, d := range models {
			t.Tasks[task][model] = Entry{Mean: d}
		}
	}
	for task, models := range s.measured {
		if t.Tasks[task] == nil {
			t.Tasks[task] = map[string]Entry{}
		}
		for model, e := range models {
			t.Tasks[task][model] = e
		}
	}
	for task, models := range t.Tasks {
		names := make([]string, 0, len(models))
		for m := range models {
			names = append(names, m)
		}
		slices.SortFunc(names, func(a, b string) int {
			if ma, mb := models[a].Mean, models[b].Mean; ma != mb {
				if ma < mb {
					return -1
				}
				return 1
			}
			if a < b {
				return -1
			}
			return 1
		})
		t.prefer[task] = names
	}
	s.table.Store(t)
}

// writeLocked writes the measured runs: a temporary file, fsync, rename over
// the old one, fsync of the folder. A failure leaves the old file whole.
func (s *Store) writeLocked() error {
	f := fileFormat{Schema: fileSchema, Tasks: map[string]map[string]fileEntry{}, Owners: s.owner}
	for task, models := range s.measured {
		f.Tasks[task] = map[string]fileEntry{}
		for model, e := range models {
			f.Tasks[task][model] = fileEntry{Seconds: e.Mean.Seconds(), Runs: e.Runs}
		}
	}
	b, err := json.MarshalIndent(&f, "", "  ")
	if err != nil {
		return err
	}
	return statefile.Write(s.path, append(b, '\n'), stateFileMode)
}

// API is the table as GET /v1/profiles answers it: tasks by name, each
// task's models fastest first.
func (t *Table) API() api.ProfileList {
	tasks := make([]string, 0, len(t.Tasks))
	for task := range t.Tasks {
		tasks = append(tasks, task)
	}
	sort.Strings(tasks)
	out := api.ProfileList{Profiles: make([]api.TaskProfile, 0, len(tasks))}
	for _, task := range tasks {
		r := api.TaskProfile{Task: task, Models: []api.ModelRunTime{}}
		for _, m := range t.prefer[task] {
			e := t.Tasks[task][m]
			r.Models = append(r.Models, api.ModelRunTime{Model: m, Seconds: e.Mean.Seconds(), Runs: e.Runs})
		}
		out.Profiles = append(out.Profiles, r)
	}
	return out
}
