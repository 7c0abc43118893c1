package profiles

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const a100, t4 = "NVIDIA A100-SXM4-80GB", "Tesla T4"

func TestSeedsOrderModels(t *testing.T) {
	s, err := Open(t.TempDir(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	s.Seed(map[string]map[string]time.Duration{"resnet50": {a100: 95 * time.Second, t4: 410 * time.Second}})
	if got := s.Prefer(1000, "resnet50"); !slices.Equal(got, []string{a100, t4}) {
		t.Fatalf("Prefer = %v", got)
	}
	if got := s.Prefer(1000, "unknown"); got != nil {
		t.Fatalf("Prefer(unknown) = %v, want nil", got)
	}
}

// TestRecordMovesTheMean: each run moves the mean by Weight of its
// difference, starting from the seed; the order of models follows.
func TestRecordMovesTheMean(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	s.Seed(map[string]map[string]time.Duration{"bert": {a100: 100 * time.Second, t4: 120 * time.Second}})
	// 100s → 0.7·100 + 0.3·200 = 130s, then 0.7·130 + 0.3·200 = 151s: the
	// A100 falls behind the T4.
	for _, want := range []time.Duration{130 * time.Second, 151 * time.Second} {
		s.Record("bert", a100, 1000, 200*time.Second)
		if e := s.Table().Learned[1000]["bert"][a100]; e.Mean != want {
			t.Fatalf("mean %s, want %s", e.Mean, want)
		}
	}
	if got := s.Prefer(1000, "bert"); !slices.Equal(got, []string{t4, a100}) {
		t.Fatalf("Prefer = %v", got)
	}
	// Another user's placements follow the config's figures, not uid
	// 1000's runs.
	if got := s.Prefer(1001, "bert"); !slices.Equal(got, []string{a100, t4}) {
		t.Fatalf("uid 1001's Prefer = %v", got)
	}
	// A task the config does not know starts at its first run.
	s.Record("new", t4, 1000, 10*time.Second)
	if e := s.Table().Learned[1000]["new"][t4]; e.Mean != 10*time.Second || e.Runs != 1 {
		t.Fatalf("new task entry %+v", e)
	}
	// The measured runs survive a restart, and the seeds come back from the
	// config.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if e := s2.Table().Learned[1000]["bert"][a100]; e.Mean != 151*time.Second || e.Runs != 2 {
		t.Fatalf("after restart %+v", e)
	}
	if _, ok := s2.Table().Learned[1000]["bert"][t4]; ok {
		t.Fatal("a seed was written to the state file")
	}
	api := s2.Table().API(1000, false)
	if len(api.Profiles) != 2 || api.Profiles[0].Task != "bert" || api.Profiles[0].Models[0].Seconds != 151 || api.Learned != nil {
		t.Fatalf("API = %+v", api)
	}
	// Another user sees nothing of uid 1000's runs; an admin sees them by uid.
	if other := s2.Table().API(1001, false); len(other.Profiles) != 0 || other.Learned != nil {
		t.Fatalf("uid 1001's API = %+v", other)
	}
	admin := s2.Table().API(0, true)
	if len(admin.Learned) != 1 || admin.Learned[0].UID != 1000 || len(admin.Learned[0].Profiles) != 2 {
		t.Fatalf("admin's API = %+v", admin)
	}
	if st, err := os.Stat(filepath.Join(dir, fileName)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("profiles.json: %v, %v; want mode 0600", st.Mode(), err)
	}
}

// TestDamagedFileIsSetAside: a file that does not parse is kept beside
// under another name, and the table starts empty.
func TestDamagedFileIsSetAside(t *testing.T) {
	for _, body := range []string{"{", `{"schema":"other"}`, `{"schema":"gpulet.profiles/v1","tasks":{"x":{"m":{"seconds":-1,"runs":1}}}}`} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, fileName), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := Open(dir, quiet)
		if err != nil || len(s.Table().Learned) != 0 {
			t.Fatalf("%s: %v", body, err)
		}
		if b, err := os.ReadFile(filepath.Join(dir, fileName+".damaged")); err != nil || string(b) != body {
			t.Errorf("%s: set aside %q, %v", body, b, err)
		}
	}
}

// fakeClock makes s's runs' times its own: each run a second after the last.
func fakeClock(s *Store) *time.Time {
	at := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	s.now = func() time.Time {
		at = at.Add(time.Second)
		return at
	}
	return &at
}

// checkPublished checks that the table published run by run is the one
// made from scratch.
func checkPublished(t *testing.T, s *Store) {
	t.Helper()
	got := s.Table()
	s.mu.Lock()
	s.publishLocked()
	s.mu.Unlock()
	want := s.Table()
	if !reflect.DeepEqual(got.Learned, want.Learned) || !reflect.DeepEqual(got.preferOf, want.preferOf) {
		t.Fatal("the table published run by run differs from the one made from scratch")
	}
}

func TestLimitsMakeRoom(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	fakeClock(s)
	for i := 0; i < MaxModelsPerTask; i++ {
		s.Record("t", fmt.Sprint("model", i), 1000, time.Second)
	}
	s.Record("t", "model0", 1000, time.Second)
	// A model past the limit takes the place of the least recently run.
	s.Record("t", "new model", 1000, time.Second)
	ms := s.Table().Learned[1000]["t"]
	if len(ms) != MaxModelsPerTask || ms["new model"].Runs != 1 || ms["model0"].Runs != 2 || ms["model1"].Runs != 0 {
		t.Fatalf("after a model past the limit: %d models, new %+v, model0 %+v, model1 %+v", len(ms), ms["new model"], ms["model0"], ms["model1"])
	}
	// One uid keeps at most MaxTasksPerUID tasks, across restarts: a new
	// one takes the place of its least recently run.
	for i := 1; i < MaxTasksPerUID; i++ {
		s.Record(fmt.Sprint("task", i), t4, 1000, time.Second)
	}
	s.Record("task1", t4, 1000, time.Second)
	s.Record("one task more", t4, 1000, time.Second)
	tasks := s.Table().Learned[1000]
	if len(tasks) != MaxTasksPerUID || tasks["one task more"] == nil || tasks["task1"] == nil || tasks["t"] != nil {
		t.Fatalf("uid 1000 past its cap: %d tasks, t kept %v, task1 kept %v", len(tasks), tasks["t"] != nil, tasks["task1"] != nil)
	}
	checkPublished(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	at := fakeClock(s2)
	*at = at.Add(time.Hour)
	s2.Record("after restart", t4, 1000, time.Second)
	if tasks := s2.Table().Learned[1000]; len(tasks) != MaxTasksPerUID || tasks["task2"] != nil {
		t.Fatalf("the cap across a restart: %d tasks, task2 kept %v", len(tasks), tasks["task2"] != nil)
	}
	// Another uid and root are not held back by it.
	for _, uid := range []uint32{1001, 0} {
		s2.Record(fmt.Sprint("other", uid), t4, uid, time.Second)
		if s2.Prefer(uid, fmt.Sprint("other", uid)) == nil {
			t.Fatalf("uid %d's run not kept", uid)
		}
	}
}

// TestFullTableSharedFairly: throwaway users fill the table to its node-wide
// limit; another user's runs are still recorded, each taking the place of a
// task of whoever holds the most, so that no one is left with less than an
// equal share.
func TestFullTableSharedFairly(t *testing.T) {
	s, err := Open(t.TempDir(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fakeClock(s)
	flooders := MaxTasks / MaxTasksPerUID
	for u := 0; u < flooders; u++ {
		for i := 0; i < MaxTasksPerUID; i++ {
			s.Record(fmt.Sprint("junk", i), t4, uint32(5000+u), time.Second)
		}
	}
	const mine = 100
	for i := 0; i < mine; i++ {
		s.Record(fmt.Sprint("real", i), a100, 2000, time.Second)
	}
	checkPublished(t, s)
	learned := s.Table().Learned
	if n := len(learned[2000]); n != mine {
		t.Fatalf("uid 2000 kept %d of its %d tasks in a full table", n, mine)
	}
	total, least := 0, MaxTasks
	for u := 0; u < flooders; u++ {
		n := len(learned[uint32(5000+u)])
		total += n
		least = min(least, n)
	}
	if total+mine != MaxTasks {
		t.Fatalf("%d tasks kept, want %d", total+mine, MaxTasks)
	}
	// 100 places taken from 16 users holding the most: about 6 each.
	if want := MaxTasksPerUID - (mine+flooders-1)/flooders; least < want {
		t.Fatalf("a user was left %d tasks, want at least %d: the places were not taken from those holding the most", least, want)
	}
}

// TestStaleFiguresExpire: a figure no run has moved for MaxAge is dropped,
// from the table and then from the file; a file's own stale figures are
// dropped when it is read.
func TestStaleFiguresExpire(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	at := fakeClock(s)
	s.Record("old", t4, 1000, time.Second)
	*at = at.Add(MaxAge / 2)
	s.Record("recent", t4, 1000, time.Second)
	s.Record("old", a100, 1001, time.Second)
	*at = at.Add(MaxAge/2 + time.Hour)
	s.expire()
	learned := s.Table().Learned
	if learned[1000]["old"] != nil || learned[1000]["recent"] == nil || learned[1001]["old"] == nil {
		t.Fatalf("after MaxAge: %+v", learned)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, fileName))
	if err != nil || strings.Count(string(b), `"old"`) != 1 {
		t.Fatalf("file after MaxAge:\n%s %v", b, err)
	}
	old := `{"schema":"gpulet.profiles/v2","users":{"1000":{"x":{"Tesla T4":{"seconds":1,"runs":1,"last":1}}}}}`
	if err := os.WriteFile(filepath.Join(dir, fileName), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	if len(s2.Table().Learned) != 0 {
		t.Fatalf("a figure of 1970 read back: %+v", s2.Table().Learned)
	}
	if b, err := os.ReadFile(filepath.Join(dir, fileName)); err != nil || strings.Contains(string(b), `"x"`) {
		t.Fatalf("file after a stale figure was dropped at start:\n%s %v", b, err)
	}
}

// TestWritesCoalesced: runs as fast as they come cost at most one write of
// the file per writeEvery, and Close writes the last of them.
func TestWritesCoalesced(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	s.writeEvery = 50 * time.Millisecond
	start := time.Now()
	runs := 0
	for time.Since(start) < 300*time.Millisecond {
		s.Record(fmt.Sprint("task", runs%50), t4, uint32(1000+runs%7), time.Second)
		runs++
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	st, err := os.Stat(filepath.Join(dir, fileName))
	if err != nil {
		t.Fatal(err)
	}
	writes := int64(elapsed/s.writeEvery) + 2
	s.mu.Lock()
	written := s.written
	s.mu.Unlock()
	if written > writes*st.Size() {
		t.Fatalf("%d runs in %s wrote %d bytes; a %d-byte file every %s allows %d", runs, elapsed, written, st.Size(), s.writeEvery, writes*st.Size())
	}
	s2, err := Open(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	n := 0
	for _, tasks := range s2.Table().Learned {
		for _, ms := range tasks {
			n += ms[t4].Runs
		}
	}
	if n != runs {
		t.Fatalf("%d runs read back, %d recorded", n, runs)
	}
}

// TestWriteFailureKeepsTheOldFile: runs that cannot be written stay in
// memory, the file on disk stays whole, and the write is tried again.
func TestWriteFailureKeepsTheOldFile(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	s.writeEvery = 10 * time.Millisecond
	s.Record("t", t4, 1000, time.Second)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(dir, fileName))
	s, err = Open(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	s.writeEvery = 10 * time.Millisecond
	s.mu.Lock()
	s.path = filepath.Join(dir, "missing", fileName)
	s.mu.Unlock()
	s.Record("t", t4, 1000, time.Second)
	time.Sleep(50 * time.Millisecond)
	if after, _ := os.ReadFile(filepath.Join(dir, fileName)); string(before) != string(after) {
		t.Fatal("the old file changed")
	}
	s.mu.Lock()
	s.path = filepath.Join(dir, fileName)
	s.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for {
		after, _ := os.ReadFile(filepath.Join(dir, fileName))
		if strings.Contains(string(after), `"runs": 2`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the failed write was not tried again:\n%s", after)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"schema":"gpulet.profiles/v1","tasks":{"x":{"Tesla T4":{"seconds":12.5,"runs":3}}}}`))
	f.Add([]byte(`{"schema":"gpulet.profiles/v1","tasks":{"":{}}}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"schema":"gpulet.profiles/v1","tasks":{"x":{"Tesla T4":{"seconds":12.5,"runs":3}}},"owners":{"x":1000}}`))
	f.Add([]byte(`{"schema":"gpulet.profiles/v2","users":{"1000":{"x":{"Tesla T4":{"seconds":12.5,"runs":3}}}}}`))
	f.Add([]byte(`{"schema":"gpulet.profiles/v2","users":{"-1":{}}}`))
	f.Add([]byte(`{"schema":"gpulet.profiles/v2","users":{"4294967296":{}}}`))
	f.Add([]byte(`{"schema":"gpulet.profiles/v2","tasks":{}}`))
	f.Add([]byte(`{"schema":"gpulet.profiles/v2","users":{"1000":{"x":{"Tesla T4":{"seconds":12.5,"runs":3,"last":-5}}}}}`))
	f.Add([]byte(`{"schema":"gpulet.profiles/v2","users":{"1000":{"x":{"Tesla T4":{"seconds":12.5,"runs":3,"last":99999999999}}}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, _, err := decode(b, time.Unix(1e9, 0))
		if err != nil {
			return
		}
		kept := 0
		for _, tasks := range m {
			kept += len(tasks)
			for task, models := range tasks {
				for model, e := range models {
					if task == "" || model == "" || e.Mean <= 0 || e.Runs < 1 || e.Last.After(time.Unix(1e9, 0)) || e.Last.Before(time.Unix(0, 0)) {
						t.Fatalf("accepted %q %q %+v", task, model, e)
					}
				}
			}
		}
		if kept > MaxTasks {
			t.Fatalf("accepted %d tasks", kept)
		}
	})
}

// TestOlderSharedFileIsMigrated: a file of the shared format is read, each
// task's figures going to the uid whose run brought it in (a task without
// one is dropped), and written again at once in the current format, 0600.
func TestOlderSharedFileIsMigrated(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, fileName)
	old := `{"schema":"gpulet.profiles/v1","tasks":{"bert":{"Tesla T4":{"seconds":12.5,"runs":3}},"orphan":{"Tesla T4":{"seconds":1,"runs":1}}},"owners":{"bert":1000}}`
	if err := os.WriteFile(path, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if e := s.Table().Learned[1000]["bert"][t4]; e.Mean != 12500*time.Millisecond || e.Runs != 3 {
		t.Fatalf("uid 1000's bert on the T4: %+v", e)
	}
	if len(s.Table().Learned) != 1 || len(s.Table().Learned[1000]) != 1 {
		t.Fatalf("learned after the migration: %+v", s.Table().Learned)
	}
	if got := s.Prefer(1001, "bert"); got != nil {
		t.Fatalf("another uid inherits the migrated figures: %v", got)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("migrated file: %v, %v; want mode 0600", st.Mode(), err)
	}
	b, _ := os.ReadFile(path)
	if !strings.Contains(string(b), `"schema": "gpulet.profiles/v2"`) || strings.Contains(string(b), "orphan") {
		t.Fatalf("migrated file:\n%s", b)
	}
	// A current file left readable by others is made private at start.
	os.Chmod(path, 0o644)
	if _, err := Open(dir, quiet); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("reopened file: %v, %v; want mode 0600", st.Mode(), err)
	}
}
