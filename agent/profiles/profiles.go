// Package profiles keeps the task–engine affinity table (docs/design.md
// §1.9): per task, its run time on each GPU model. The config file's
// entries are shared by every user and are the starting point; the runs the
// daemon measures (a lease with a task whose process exited) are kept per
// user: a run of uid moves uid's own time for the task on that model by an
// exponentially weighted mean, and steers only uid's later placements, so
// that no user can steer another's by running a task badly on purpose.
// Measured entries are kept in the state dir (file.go), private to root and
// written with fsync, so that they survive restarts and reboots; runs are
// written together, at most once per WriteEvery (keep.go), whatever the rate
// of runs. The table is bounded, and shared fairly: a user's new task takes
// the place of the least recently run task of the user who holds the most,
// and figures no run has moved for MaxAge are dropped (keep.go).
//
// Readers never lock: each change publishes an immutable table, and a
// request's preference (Prefer) is a lookup in it.
package profiles

import (
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpulet/gpulet/api"
)

// Weight is the weight of a new run in the mean: 0.3 follows a task whose
// run time shifts (new data, new code) within a few runs, while one odd run
// moves the mean by less than a third of its difference.
const Weight = 0.3

// Limits on what measured runs can make the store keep: a task name comes
// from any caller, so a flood of names must not grow the file without end,
// nor keep another user's runs out.
const (
	// MaxTasks bounds the measured tasks of all users together (a task
	// two users ran counts twice). When it is reached, a new task takes the
	// place of the least recently run task of the user who holds the most
	// (the new task's user's own when that is it): each user keeps at least
	// an equal share of the table, whoever else fills it.
	MaxTasks = 4096
	// MaxTasksPerUID bounds the tasks one uid (root aside) has measured
	// runs of: a new one past it takes the place of that uid's least
	// recently run task.
	MaxTasksPerUID = 256
	// MaxModelsPerTask bounds a task's models; a new one past it takes the
	// place of the model the task ran on least recently.
	MaxModelsPerTask = 64
	// MaxAge is how long a measured figure stays without a run that moves
	// it: a task not run for that long has likely changed or gone.
	MaxAge = 90 * 24 * time.Hour
	// WriteEvery is the least time between two writes of the file: a flood
	// of runs costs at most one file a WriteEvery.
	WriteEvery = 10 * time.Second
)

// Entry is one task's run time on one GPU model.
type Entry struct {
	// Mean is the run time: the config's figure, moved by each measured run.
	Mean time.Duration
	// Runs counts the measured runs it rests on (0: the config's figure only).
	Runs int
	// Last is when the last of them was measured (zero: none).
	Last time.Time
}

// models is one task's entries by GPU model name.
type models = map[string]Entry

// Table is the affinity table at one moment. It is never modified once
// published.
type Table struct {
	// Seeds are the config's figures, task → model → entry, for everyone.
	Seeds map[string]models
	// Learned are the measured runs, uid → task → model → entry.
	Learned map[uint32]map[string]models
	// prefer lists per task its seeded models, fastest first; preferOf,
	// per uid, the same for the tasks uid has measured runs of, its own
	// figures over the seeds.
	prefer   map[string][]string
	preferOf map[uint32]map[string][]string
}

// Prefer lists the GPU models task runs on for uid, fastest first: by uid's
// own measured runs over the config's figures; nil for a task neither knows.
func (t *Table) Prefer(uid uint32, task string) []string {
	if p, ok := t.preferOf[uid][task]; ok {
		return p
	}
	return t.prefer[task]
}

// Of is the table as uid sees it: the config's figures with uid's measured
// runs over them.
func (t *Table) Of(uid uint32) map[string]models {
	out := make(map[string]models, len(t.Seeds))
	for task, ms := range t.Seeds {
		out[task] = maps.Clone(ms)
	}
	for task, ms := range t.Learned[uid] {
		if out[task] == nil {
			out[task] = models{}
		}
		maps.Copy(out[task], ms)
	}
	return out
}

// Store is the table, its seeds from the config, and its file.
type Store struct {
	path string
	log  *slog.Logger
	// now is the clock of runs' ages; writeEvery is WriteEvery, less in
	// tests.
	now        func() time.Time
	writeEvery time.Duration
	// mu guards everything below and serializes writes of the file;
	// readers use table.
	mu       sync.Mutex
	seeds    map[string]map[string]time.Duration
	measured map[uint32]map[string]models
	// kept counts the measured tasks of all uids (MaxTasks).
	kept int
	// dirty says runs were recorded (or figures dropped) since the file was
	// last written; writeTimer writes them, when armed; lastWrite is when
	// the file was last written, written the bytes written in all.
	dirty      bool
	writeTimer *time.Timer
	lastWrite  time.Time
	written    int64
	// expireTimer drops stale figures every expireEvery; closed stops both
	// timers for good.
	expireTimer *time.Timer
	closed      bool
	table       atomic.Pointer[Table]
}

// Open loads the measured runs kept in dir (none yet: an empty table). A
// file that cannot be read is an error. One that does not parse is set aside
// (profiles.json.damaged), so that the runs it held are not written over,
// and the table starts from the config's figures alone: log says so. A file
// of the older shared format, or one others may read, is written again at
// once in the current format, mode 0600 (file.go says how it migrates).
//
// Figures older than MaxAge are dropped at once, and then every expireEvery.
// Close writes what is not written yet.
func Open(dir string, log *slog.Logger) (*Store, error) {
	s := &Store{path: filepath.Join(dir, fileName), log: log, now: time.Now, writeEvery: WriteEvery,
		measured: map[uint32]map[string]models{}}
	if err := s.load(log); err != nil {
		return nil, err
	}
	for _, tasks := range s.measured {
		s.kept += len(tasks)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked()
	s.publishLocked()
	s.expireTimer = time.AfterFunc(expireEvery, s.expire)
	return s, nil
}

// Seed puts the config file's run times in place (a start or a reload): a
// task's measured runs start from its seed, and a task without measured runs
// is its seed.
func (s *Store) Seed(seeds map[string]map[string]time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seeds = seeds
	s.publishLocked()
}

// Record adds one measured run of task on model, by a lease of uid, to uid's
// own figures, making room as the limits say, and has the file written
// within WriteEvery.
func (s *Store) Record(task, model string, uid uint32, ran time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tasks := s.measured[uid]
	ms, ok := tasks[task]
	evicted := noUID
	if !ok {
		evicted = s.makeRoomLocked(uid)
		if tasks = s.measured[uid]; tasks == nil {
			tasks = map[string]models{}
			s.measured[uid] = tasks
		}
		ms = models{}
		tasks[task] = ms
		s.kept++
	}
	e, ok := ms[model]
	if !ok {
		if len(ms) >= MaxModelsPerTask {
			delete(ms, leastRecent(ms))
		}
		if seed, ok := s.seeds[task][model]; ok {
			e.Mean = seed
		} else {
			e.Mean = ran
		}
	}
	e.Mean = time.Duration((1-Weight)*float64(e.Mean) + Weight*float64(ran))
	e.Runs++
	e.Last = s.now()
	ms[model] = e
	s.publishTaskLocked(uid, task)
	if evicted != uid && evicted != noUID {
		s.publishUIDsLocked(evicted)
	}
	s.changedLocked()
}

// Table returns the table as last published.
func (s *Store) Table() *Table { return s.table.Load() }

// Prefer lists the GPU models task runs on for uid, fastest first, as the
// table last published says. It takes no lock: the lease engine asks it
// under its own.
func (s *Store) Prefer(uid uint32, task string) []string { return s.table.Load().Prefer(uid, task) }

// publishLocked makes a new Table of the seeds and the measured runs.
func (s *Store) publishLocked() {
	t := &Table{Seeds: map[string]models{}, Learned: map[uint32]map[string]models{},
		prefer: map[string][]string{}, preferOf: map[uint32]map[string][]string{}}
	for task, byModel := range s.seeds {
		t.Seeds[task] = models{}
		for model, d := range byModel {
			t.Seeds[task][model] = Entry{Mean: d}
		}
		t.prefer[task] = fastestFirst(t.Seeds[task])
	}
	for uid := range s.measured {
		t.publishUID(uid, s.measured[uid])
	}
	s.table.Store(t)
}

// publishUIDsLocked makes a new Table in which only the measured runs of
// uids changed: the rest is the last Table's, which nobody modifies, so a
// run costs its own user's tasks, not the whole table's.
func (s *Store) publishUIDsLocked(uids ...uint32) {
	old := s.table.Load()
	t := &Table{Seeds: old.Seeds, prefer: old.prefer, Learned: maps.Clone(old.Learned), preferOf: maps.Clone(old.preferOf)}
	for _, uid := range uids {
		delete(t.Learned, uid)
		delete(t.preferOf, uid)
		if tasks, ok := s.measured[uid]; ok {
			t.publishUID(uid, tasks)
		}
	}
	s.table.Store(t)
}

// publishTaskLocked makes a new Table in which only uid's task changed, and
// uid's tasks dropped since the last Table are gone: a run costs a copy of
// its user's list of tasks, and its task's entries.
func (s *Store) publishTaskLocked(uid uint32, task string) {
	old := s.table.Load()
	t := &Table{Seeds: old.Seeds, prefer: old.prefer, Learned: maps.Clone(old.Learned), preferOf: maps.Clone(old.preferOf)}
	learned, prefer := maps.Clone(t.Learned[uid]), maps.Clone(t.preferOf[uid])
	if learned == nil {
		learned, prefer = map[string]models{}, map[string][]string{}
	}
	tasks := s.measured[uid]
	for name := range learned {
		if _, ok := tasks[name]; !ok {
			delete(learned, name)
			delete(prefer, name)
		}
	}
	ms := tasks[task]
	learned[task] = maps.Clone(ms)
	merged := maps.Clone(t.Seeds[task])
	if merged == nil {
		merged = models{}
	}
	maps.Copy(merged, ms)
	prefer[task] = fastestFirst(merged)
	t.Learned[uid], t.preferOf[uid] = learned, prefer
	s.table.Store(t)
}

// publishUID puts uid's measured runs, tasks, into t, which is not yet
// published.
func (t *Table) publishUID(uid uint32, tasks map[string]models) {
	t.Learned[uid] = make(map[string]models, len(tasks))
	t.preferOf[uid] = make(map[string][]string, len(tasks))
	for task, ms := range tasks {
		t.Learned[uid][task] = maps.Clone(ms)
		merged := maps.Clone(t.Seeds[task])
		if merged == nil {
			merged = models{}
		}
		maps.Copy(merged, ms)
		t.preferOf[uid][task] = fastestFirst(merged)
	}
}

// fastestFirst lists the models of ms by run time, then by name.
func fastestFirst(ms models) []string {
	names := slices.Collect(maps.Keys(ms))
	slices.SortFunc(names, func(a, b string) int {
		if ma, mb := ms[a].Mean, ms[b].Mean; ma != mb {
			if ma < mb {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return names
}

// API is the table as GET /v1/profiles answers uid: its own view (the
// config's figures, its measured runs over them) and, for an admin, every
// user's measured runs.
func (t *Table) API(uid uint32, admin bool) api.ProfileList {
	out := api.ProfileList{Profiles: apiTasks(t.Of(uid))}
	if admin {
		uids := slices.Sorted(maps.Keys(t.Learned))
		for _, u := range uids {
			out.Learned = append(out.Learned, api.UserProfiles{UID: u, Profiles: apiTasks(t.Learned[u])})
		}
	}
	return out
}

// apiTasks lists tasks by name, each task's models fastest first.
func apiTasks(tasks map[string]models) []api.TaskProfile {
	names := slices.Collect(maps.Keys(tasks))
	sort.Strings(names)
	out := make([]api.TaskProfile, 0, len(names))
	for _, task := range names {
		r := api.TaskProfile{Task: task, Models: []api.ModelRunTime{}}
		for _, m := range fastestFirst(tasks[task]) {
			e := tasks[task][m]
			r.Models = append(r.Models, api.ModelRunTime{Model: m, Seconds: e.Mean.Seconds(), Runs: e.Runs})
		}
		out = append(out, r)
	}
	return out
}
