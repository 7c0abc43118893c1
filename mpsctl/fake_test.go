package mpsctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
)

// newFake makes Daemons on a fake control binary; Close runs at cleanup.
func newFake(t *testing.T, control string, k int, cfg Config) *Daemons {
	t.Helper()
	cfg.Control = control
	cfg.RunDir = shortDir(t)
	cfg.InstancesPerGPU = k
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	d, err := New(cfg, []string{gpuA})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// fakesAlive counts live fake processes that write to log.
func fakesAlive(t *testing.T, log string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !alive(pid) {
			continue
		}
		environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if bytes.Contains(environ, []byte("MPSCTL_FAKE_LOG="+log+"\x00")) {
			n++
		}
	}
	return n
}

// TestRunnerTimeout: a hung control binary is killed when the timeout fires, and
// the error says so; a caller's cancellation is not reported as a timeout.
func TestRunnerTimeout(t *testing.T) {
	t.Parallel()
	control, log := fakeControl(t, "hang")
	r := runner{path: control, timeout: 200 * time.Millisecond}

	start := time.Now()
	_, err := r.run(context.Background(), nil, probeCommands)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("run = %v, want ErrTimeout", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("run took %v with a 200ms timeout", took)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = r.run(ctx, nil, probeCommands)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrTimeout) {
		t.Fatalf("run with the caller's deadline = %v, want context.DeadlineExceeded and not ErrTimeout", err)
	}
	if n := fakesAlive(t, log); n != 0 {
		t.Fatalf("%d hung fakes still run", n)
	}
}

// TestFakeHang: with a binary that hangs, Start fails within its timeouts instead
// of hanging gpuletd, the instances are down with ErrTimeout, and Close returns.
func TestFakeHang(t *testing.T) {
	t.Parallel()
	control, log := fakeControl(t, "hang")
	d := newFake(t, control, 2, Config{Timeout: 200 * time.Millisecond})

	start := time.Now()
	err := d.Start(context.Background())
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("Start = %v, want ErrTimeout", err)
	}
	// Per instance: the adoption probe and "-d" time out; instances run in parallel.
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Start took %v", took)
	}
	for _, s := range d.Status(gpuA) {
		if s.State != api.InstanceDown || !errors.Is(s.Err, ErrTimeout) {
			t.Fatalf("instance %d: %s %v, want down with ErrTimeout", s.Instance, s.State, s.Err)
		}
	}
	if err := d.Close(); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Close = %v, want the probe's ErrTimeout", err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if n := fakesAlive(t, log); n != 0 {
		t.Fatalf("%d hung fakes still run", n)
	}
}

// TestFakeGarbage: a binary that answers garbage never counts as running, and
// restarts follow the exponential backoff on the injected clock.
func TestFakeGarbage(t *testing.T) {
	t.Parallel()
	control, log := fakeControl(t, "garbage")
	clock := &fakeClock{t: time.Unix(1_000_000, 0)}
	d := newFake(t, control, 1, Config{
		Timeout:    2 * time.Second,
		MinBackoff: time.Second,
		MaxBackoff: 8 * time.Second,
		Now:        clock.Now,
	})
	starts := func() int {
		return strings.Count(strings.Join(fakeLog(t, log), "\n"), "-d")
	}

	if err := d.Start(context.Background()); !errors.Is(err, ErrBadOutput) {
		t.Fatalf("Start = %v, want ErrBadOutput", err)
	}
	if s := d.Status(gpuA)[0]; s.State != api.InstanceDown || !errors.Is(s.Err, ErrBadOutput) {
		t.Fatalf("state %s err %v, want down with ErrBadOutput", s.State, s.Err)
	}
	// Starts expected after each step: the waits are 1s, 2s, 4s, 8s, 8s.
	steps := []struct {
		advance time.Duration
		starts  int
	}{
		{0, 1},
		{999 * time.Millisecond, 1},
		{time.Millisecond, 2},
		{time.Second, 2},
		{time.Second, 3},
		{3 * time.Second, 3},
		{time.Second, 4},
		{8 * time.Second, 5},
		{7 * time.Second, 5},
		{time.Second, 6},
	}
	for i, s := range steps {
		clock.Add(s.advance)
		d.Check(context.Background())
		if got := starts(); got != s.starts {
			t.Fatalf("step %d (+%v): %d starts, want %d", i, s.advance, got, s.starts)
		}
		if st := d.Status(gpuA)[0].State; st != api.InstanceDown {
			t.Fatalf("step %d: state %s, want down", i, st)
		}
	}
}

// TestFakeBusy: an instance whose server has clients reports the server's uid and
// the clients, is adopted without a start, and is left running by Close.
func TestFakeBusy(t *testing.T) {
	t.Parallel()
	server := os.Getpid()
	control, log := fakeControl(t, "busy", "MPSCTL_FAKE_SERVER="+strconv.Itoa(server))
	var lines testutil.SyncBuffer
	d := newFake(t, control, 1, Config{Timeout: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(&lines, nil))})

	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.Check(context.Background())
	s := d.Status(gpuA)[0]
	uid := uint32(os.Getuid())
	if s.State != api.InstanceRunning || s.ServerUID == nil || *s.ServerUID != uid || s.Clients != 2 {
		t.Fatalf("status %+v (uid %v), want running, server uid %d, 2 clients", s, s.ServerUID, uid)
	}
	if len(s.Servers) != 1 || s.Servers[0].PID != server || !slices.Equal(s.Servers[0].Clients, []int{4242, 4343}) {
		t.Fatalf("servers %+v, want server %d with clients 4242 and 4343", s.Servers, server)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	cmds := fakeLog(t, log)
	if slices.Contains(cmds, "-d") || slices.Contains(cmds, "quit") {
		t.Fatalf("commands %q: a busy instance was started or quit", cmds)
	}
	// The stop says what is left running and how it ends.
	if said := lines.String(); !strings.Contains(said, "leaving MPS control daemon running") || !strings.Contains(said, "quit") ||
		!strings.Contains(said, "pipe="+d.PipeDir(gpuA, 0)) {
		t.Fatalf("the stop said %q; want the daemon left running, its pipe folder and how to quit it", said)
	}
	if !slices.Contains(cmds, "get_client_list "+strconv.Itoa(server)) {
		t.Fatalf("commands %q: clients were not asked", cmds)
	}
}

// TestFakeIdleServer: an MPS server whose last client has gone stays up (as on
// the H100), but serves nobody: it is listed, yet binds the instance to no
// user, so that another user's lease may land there. The instance is then
// idle and Close quits it.
func TestFakeIdleServer(t *testing.T) {
	t.Parallel()
	server := os.Getpid()
	control, log := fakeControl(t, "idle", "MPSCTL_FAKE_SERVER="+strconv.Itoa(server))
	d := newFake(t, control, 1, Config{Timeout: 2 * time.Second})
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.Check(context.Background())
	s := d.Status(gpuA)[0]
	if s.State != api.InstanceRunning || s.ServerUID != nil || s.Clients != 0 {
		t.Fatalf("status %+v (uid %v): an idle server must serve nobody", s, s.ServerUID)
	}
	if len(s.Servers) != 1 || s.Servers[0].PID != server || s.Servers[0].UID == nil || len(s.Servers[0].Clients) != 0 {
		t.Fatalf("servers %+v, want the idle server %d listed with its uid and no clients", s.Servers, server)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if cmds := fakeLog(t, log); !slices.Contains(cmds, "quit") {
		t.Fatalf("commands %q: an instance whose server is idle was not quit at close", cmds)
	}
}

// serverTable is a ServerSource over fixed servers: pid → uid and clients.
type serverTable map[int]struct {
	uid     uint32
	clients []int
}

func (s serverTable) ServerList(string, int) []int {
	var pids []int
	for pid := range s {
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	return pids
}

func (s serverTable) ClientList(pid int) ([]int, bool) { e, ok := s[pid]; return e.clients, ok }
func (s serverTable) ServerUID(pid int) (uint32, bool) { e, ok := s[pid]; return e.uid, ok }

// TestServerSourceAnswersForServers: with a ServerSource (the simulated
// backend's servers), the probe takes servers, clients and uids from it, and
// the server that has clients is the one that serves, not an idle one.
func TestServerSourceAnswersForServers(t *testing.T) {
	t.Parallel()
	control, log := fakeControl(t, "idle", "MPSCTL_FAKE_SERVER=1")
	src := serverTable{5000001: {uid: 1000}, 5000002: {uid: 1001, clients: []int{77}}}
	d := newFake(t, control, 1, Config{Timeout: 2 * time.Second, Servers: src})
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := d.Status(gpuA)[0]
	if s.ServerUID == nil || *s.ServerUID != 1001 || s.Clients != 1 || len(s.Servers) != 2 {
		t.Fatalf("status %+v (uid %v): want the busy server's uid 1001, one client, two servers", s, s.ServerUID)
	}
	if cmds := fakeLog(t, log); slices.ContainsFunc(cmds, func(c string) bool { return strings.HasPrefix(c, "get_client_list") }) {
		t.Fatalf("commands %q: the daemon was asked for clients the source answers for", cmds)
	}
}
