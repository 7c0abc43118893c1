package profiles

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/gpulet/gpulet/internal/statefile"
)

const (
	fileName = "profiles.json"
	// fileSchema is the current format: measured runs per uid.
	fileSchema = "gpulet.profiles/v2"
	// sharedSchema is the older format, one table shared by every user,
	// with the uid whose run brought each task in (owners).
	sharedSchema = "gpulet.profiles/v1"
	maxFileBytes = 16 << 20
	// stateFileMode keeps the file to root: it names tasks and the uids
	// that ran them.
	stateFileMode = 0o600
	// maxSeconds keeps a run time within time.Duration.
	maxSeconds = 1e9
)

// fileFormat is the file: measured entries only (the config's seeds stay in
// the config), run times in seconds, per uid.
type fileFormat struct {
	Schema string                                     `json:"schema"`
	Users  map[uint32]map[string]map[string]fileEntry `json:"users,omitempty"`
	// Tasks and Owners are the older, shared format's (sharedSchema).
	Tasks  map[string]map[string]fileEntry `json:"tasks,omitempty"`
	Owners map[string]uint32               `json:"owners,omitempty"`
}

type fileEntry struct {
	Seconds float64 `json:"seconds"`
	Runs    int     `json:"runs"`
	// Last is when the last run was measured, in Unix seconds; a file
	// written before it was kept has none, read as the time it is read.
	Last int64 `json:"last,omitempty"`
}

// load reads the file into s.measured; see Open.
func (s *Store) load(log *slog.Logger) error {
	b, mode, err := readBounded(s.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("task profiles: %w", err)
	}
	measured, migrated, err := decode(b, s.now())
	if err != nil {
		aside, serr := statefile.SetAside(s.path)
		if serr != nil {
			return fmt.Errorf("task profiles %s: %w; and it cannot be set aside: %v", s.path, err, serr)
		}
		// It may name tasks and uids; it stays for root alone.
		os.Chmod(aside, stateFileMode)
		log.Error("task profiles file is damaged: set aside, measured run times start over", "file", s.path, "set_aside_as", aside, "err", err)
		return nil
	}
	s.measured = measured
	if !migrated && mode.Perm() == stateFileMode {
		return nil
	}
	if err := s.writeLocked(); err != nil {
		// Kept in memory all the same; at least keep the old file private.
		os.Chmod(s.path, stateFileMode)
		log.Warn("task profiles file could not be written again in the current format; the next measured run tries again", "file", s.path, "err", err)
		return nil
	}
	if migrated {
		log.Info("task profiles file migrated: each task's measured times now belong to the user whose run brought the task in; tasks without one were dropped", "file", s.path, "schema", fileSchema)
	}
	return nil
}

// readBounded reads path unless it is larger than a profile file may be,
// and returns its mode.
func readBounded(path string) ([]byte, fs.FileMode, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	if !st.Mode().IsRegular() {
		return nil, 0, fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() > maxFileBytes {
		return nil, 0, fmt.Errorf("%s is %d bytes, more than the %d a profile file may have", path, st.Size(), maxFileBytes)
	}
	b, err := os.ReadFile(path)
	return b, st.Mode(), err
}

// decode reads the file's measured runs. An older file (sharedSchema) is
// migrated (migrated is true): its table mixed every user's runs, so each
// task's figures go to the one user whose run brought the task in (its
// owner), and a task without an owner is dropped. Giving the mixed figures
// to every user would keep whatever one user taught in force for all;
// keeping them for their owner alone bounds that to one user, whose own
// runs soon outweigh the rest.
//
// Runs without a time (older files) are taken as run at now; a time after
// now (a clock set back since) is read as now, so that a figure never stays
// longer than MaxAge from its reading.
func decode(b []byte, now time.Time) (measured map[uint32]map[string]models, migrated bool, err error) {
	var f fileFormat
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, false, err
	}
	users := f.Users
	switch f.Schema {
	case fileSchema:
		if f.Tasks != nil || f.Owners != nil {
			return nil, false, errors.New("tasks and owners belong to the older format, not to " + fileSchema)
		}
	case sharedSchema:
		if f.Users != nil {
			return nil, false, errors.New("users belongs to " + fileSchema + ", not to " + sharedSchema)
		}
		if len(f.Tasks) > MaxTasks {
			return nil, false, fmt.Errorf("%d tasks, more than %d", len(f.Tasks), MaxTasks)
		}
		users = map[uint32]map[string]map[string]fileEntry{}
		for task, uid := range f.Owners {
			if _, ok := f.Tasks[task]; !ok {
				return nil, false, fmt.Errorf("owners: task %q has no measured runs", task)
			}
			if users[uid] == nil {
				users[uid] = map[string]map[string]fileEntry{}
			}
			users[uid][task] = f.Tasks[task]
		}
		// A task without an owner is checked all the same: a file with a
		// bad entry is damaged, not migrated.
		for task, ms := range f.Tasks {
			if _, err := decodeTask(task, ms, now); err != nil {
				return nil, false, err
			}
		}
		migrated = true
	default:
		return nil, false, fmt.Errorf("schema %q, want %q", f.Schema, fileSchema)
	}
	measured = make(map[uint32]map[string]models, len(users))
	kept := 0
	for uid, tasks := range users {
		kept += len(tasks)
		if kept > MaxTasks {
			return nil, false, fmt.Errorf("more than %d tasks", MaxTasks)
		}
		measured[uid] = make(map[string]models, len(tasks))
		for task, ms := range tasks {
			if measured[uid][task], err = decodeTask(task, ms, now); err != nil {
				return nil, false, fmt.Errorf("uid %d: %w", uid, err)
			}
		}
	}
	return measured, migrated, nil
}

// decodeTask checks and converts one task's measured entries.
func decodeTask(task string, ms map[string]fileEntry, now time.Time) (models, error) {
	if task == "" || len(ms) > MaxModelsPerTask {
		return nil, fmt.Errorf("task %q: empty name or more than %d models", task, MaxModelsPerTask)
	}
	out := make(models, len(ms))
	for model, e := range ms {
		mean := time.Duration(e.Seconds * float64(time.Second))
		if model == "" || !(e.Seconds > 0) || e.Seconds > maxSeconds || mean <= 0 || e.Runs < 1 {
			return nil, fmt.Errorf("task %q model %q: run time %gs over %d runs is not a measured run", task, model, e.Seconds, e.Runs)
		}
		if e.Last < 0 {
			return nil, fmt.Errorf("task %q model %q: last run at %d, before 1970", task, model, e.Last)
		}
		last := now
		if e.Last != 0 && e.Last < now.Unix() {
			last = time.Unix(e.Last, 0)
		}
		out[model] = Entry{Mean: mean, Runs: e.Runs, Last: last}
	}
	return out, nil
}

// writeLocked writes the measured runs: a temporary file, fsync, rename over
// the old one, fsync of the folder. A failure leaves the old file whole. Only
// Open (a migration), flush and Close call it: runs are written together.
func (s *Store) writeLocked() error {
	f := fileFormat{Schema: fileSchema, Users: map[uint32]map[string]map[string]fileEntry{}}
	for uid, tasks := range s.measured {
		f.Users[uid] = map[string]map[string]fileEntry{}
		for task, ms := range tasks {
			f.Users[uid][task] = map[string]fileEntry{}
			for model, e := range ms {
				f.Users[uid][task][model] = fileEntry{Seconds: e.Mean.Seconds(), Runs: e.Runs, Last: e.Last.Unix()}
			}
		}
	}
	b, err := json.MarshalIndent(&f, "", "  ")
	if err != nil {
		return err
	}
	// A failed write counts too: it is the writes' pace that is bounded.
	s.lastWrite = time.Now()
	if err := statefile.Write(s.path, append(b, '\n'), stateFileMode); err != nil {
		return err
	}
	s.written += int64(len(b)) + 1
	return nil
}
