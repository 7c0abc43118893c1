package test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// The borrowers of these tests are real gpurun commands run as another real
// user. A polite one ends at SIGTERM; a stubborn one ignores it (its trap
// says it got it, and it goes on) and only SIGKILL ends it. Both print
// "term" when SIGTERM comes.
const (
	politeScript   = `trap 'echo term; exit 0' TERM; echo up; while :; do sleep 0.05; done`
	stubbornScript = `trap 'echo term' TERM; echo up; while :; do sleep 0.05; done`
)

// reserveNode is a daemon of one T4 of 8 units whose socket two real users,
// alice and bob, may use, with a short reclaim grace.
type reserveNode struct {
	d                *e2e.Daemon
	alice, bob       e2e.User
	gpurun, gpuletCL string
}

func startReserveNode(t *testing.T, extra ...string) *reserveNode {
	t.Helper()
	sock := e2e.NewGroup(t)
	n := &reserveNode{alice: e2e.NewUser(t, sock), bob: e2e.NewUser(t, sock)}
	n.d = e2e.Start(t, append([]string{"--socket-group", sock.Name, "--sim-gpus", "1xT4", "--units-per-client", "1", "--clients-per-instance", "8", "--reclaim-grace", "1s"}, extra...)...)
	openToOthers(t, n.d)
	n.gpurun, n.gpuletCL = copyForOthers(t, e2e.Bin("gpurun")), copyForOthers(t, e2e.Bin("gpulet"))
	return n
}

// gpulet runs the gpulet CLI as u.
func (n *reserveNode) gpulet(t *testing.T, u e2e.User, args ...string) (string, int) {
	t.Helper()
	cmd := u.Command(exec.Command(n.gpuletCL, append([]string{"--socket", n.d.Socket}, args...)...))
	return e2e.Output(t, cmd)
}

// proc is a command running under gpurun, and how it ended.
type proc struct {
	cmd  *exec.Cmd
	out  *testutil.SyncBuffer
	done chan struct{}
	end  time.Time
	err  error
}

// spawn runs `gpurun [gpurunArgs] -- sh -c script` as u.
func (n *reserveNode) spawn(t *testing.T, u e2e.User, script string, gpurunArgs ...string) *proc {
	t.Helper()
	args := append(append([]string{"--socket", n.d.Socket}, gpurunArgs...), "--", "sh", "-c", script)
	p := &proc{cmd: u.Command(exec.Command(n.gpurun, args...)), out: &testutil.SyncBuffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		p.end = time.Now()
		close(p.done)
	}()
	t.Cleanup(func() { p.cmd.Process.Kill(); <-p.done })
	return p
}

// start is spawn, then waits until the command runs (it prints "up"), or
// fails the test if gpurun exits.
func (n *reserveNode) start(t *testing.T, u e2e.User, script string, gpurunArgs ...string) *proc {
	t.Helper()
	p := n.spawn(t, u, script, gpurunArgs...)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.out.String(), "up") {
		select {
		case <-p.done:
			t.Fatalf("gpurun %q as %s exited: %v\n%s", gpurunArgs, u.Name, p.err, p.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("gpurun %q as %s did not start its command:\n%s", gpurunArgs, u.Name, p.out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return p
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// killedBy is the signal that ended p, 0 if it exited.
func (p *proc) killedBy() syscall.Signal {
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return ws.Signal()
		}
	}
	return 0
}

func (n *reserveNode) reservation(t *testing.T, name string) *api.Reservation {
	t.Helper()
	r, err := n.d.Client.GetReservation(e2e.Ctx(t), name)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (n *reserveNode) snapshot(t *testing.T) *api.Snapshot {
	t.Helper()
	s, err := n.d.Client.Snapshot(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestReservationReclaimSignalsBorrowers runs the worked example of docs/design.md §1.6
// with real processes: alice reserves a workflow of stages 2, 6, 6, 8 and
// draws each stage's units with gpurun; bob's gpurun borrows every lendable
// unit without naming the reservation. Each stage start takes back what it
// needs: the borrowers get SIGTERM, the polite ones end then, the stubborn
// ones get SIGKILL once --reclaim-grace (1s) has passed. Lendable 6, 2, 2, 0
// and reclaimed 0, 4, 0, 2; alice's processes are never touched.
func TestReservationReclaimSignalsBorrowers(t *testing.T) {
	n := startReserveNode(t)
	if out, code := n.gpulet(t, n.alice, "reserve", "wf1", "--stages", "2,6,6,8", "--share", n.bob.Name); code != 0 || !strings.Contains(out, "reserved wf1: 8 unit(s) set aside") {
		t.Fatalf("reserve: exit %d: %s", code, out)
	}
	s := n.snapshot(t)
	if s.UnitsReserved != 8 || s.UnitsFree != 0 || s.GPUs[0].UnitsReserved != 8 || len(s.Reservations) != 1 {
		t.Fatalf("snapshot after reserving: reserved %d, free %d, reservations %+v", s.UnitsReserved, s.UnitsFree, s.Reservations)
	}
	if out, _ := n.gpulet(t, n.bob, "status"); !strings.Contains(out, "[rrrrrrrr]") {
		t.Fatalf("status does not mark the reserved units:\n%s", out)
	}
	var owner []*proc
	draw := func(k int) {
		for range k {
			owner = append(owner, n.start(t, n.alice, politeScript, "--reservation", "wf1"))
		}
	}
	// bob's borrowers, oldest first: stage 1 takes the four newest back
	// (two of them stubborn), stage 3 the two oldest.
	var borrowers []*proc
	for i := range 6 {
		script := politeScript
		if i >= 4 {
			script = stubbornScript
		}
		borrowers = append(borrowers, n.start(t, n.bob, script, "--preemptible"))
	}
	ls, err := n.d.Client.Leases(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if l.Owner.UID != n.bob.UID || !l.Preemptible || l.Reservation != "wf1" {
			t.Fatalf("bob's lease %+v: want preemptible, of wf1", l)
		}
	}
	draw(2)
	if out, code := e2e.Output(t, n.bob.Command(exec.Command(n.gpurun, "--socket", n.d.Socket, "--preemptible", "--", "true"))); code != 125 || !strings.Contains(out, "insufficient_units") {
		t.Fatalf("a seventh borrower: exit %d: %s", code, out)
	}
	var lendable, reclaimed []int
	r := n.reservation(t, "wf1")
	lendable, reclaimed = append(lendable, r.Lendable), append(reclaimed, r.Reclaimed)
	if r.Lent != 6 || r.InUse != 2 || r.LentTo[n.bob.Name] != 6 {
		t.Fatalf("stage 1: %+v", r)
	}
	// Stage 2: four back; the two polite at SIGTERM, the stubborn after 1s.
	t0 := time.Now()
	if out, code := n.gpulet(t, n.alice, "advance", "wf1"); code != 0 || !strings.Contains(out, "took back 4 lent unit(s)") {
		t.Fatalf("advance: exit %d: %s", code, out)
	}
	for _, p := range borrowers[2:4] {
		<-p.done
		if p.killedBy() != 0 || !strings.Contains(p.out.String(), "term") || p.end.Sub(t0) > 900*time.Millisecond {
			t.Fatalf("polite borrower: %v after %s, output %q", p.err, p.end.Sub(t0), p.out.String())
		}
	}
	for _, p := range borrowers[4:] {
		<-p.done
		if p.killedBy() != syscall.SIGKILL || !strings.Contains(p.out.String(), "term") || p.end.Sub(t0) < 950*time.Millisecond {
			t.Fatalf("stubborn borrower: %v after %s, output %q; want SIGTERM, then SIGKILL after 1s", p.err, p.end.Sub(t0), p.out.String())
		}
	}
	testutil.Eventually(t, "the reclaimed units back", func() bool { r := n.reservation(t, "wf1"); return r.Lent == 2 && r.Reclaiming == 0 })
	r = n.reservation(t, "wf1")
	lendable, reclaimed = append(lendable, r.Lendable), append(reclaimed, r.Reclaimed)
	draw(4)
	// Stage 3: nothing to take back.
	if out, code := n.gpulet(t, n.alice, "advance", "wf1"); code != 0 || strings.Contains(out, "took back") {
		t.Fatalf("advance: exit %d: %s", code, out)
	}
	r = n.reservation(t, "wf1")
	lendable, reclaimed = append(lendable, r.Lendable), append(reclaimed, r.Reclaimed)
	// Stage 4 needs all 8: the two oldest borrowers go.
	if out, code := n.gpulet(t, n.alice, "advance", "wf1"); code != 0 || !strings.Contains(out, "took back 2 lent unit(s)") {
		t.Fatalf("advance: exit %d: %s", code, out)
	}
	for _, p := range borrowers[:2] {
		<-p.done
		if !strings.Contains(p.out.String(), "term") {
			t.Fatalf("borrower ended without SIGTERM: %v %q", p.err, p.out.String())
		}
	}
	testutil.Eventually(t, "the last reclaimed units back", func() bool { return n.reservation(t, "wf1").Lent == 0 })
	r = n.reservation(t, "wf1")
	lendable, reclaimed = append(lendable, r.Lendable), append(reclaimed, r.Reclaimed)
	draw(2)
	if !slices.Equal(lendable, []int{6, 2, 2, 0}) || !slices.Equal(reclaimed, []int{0, 4, 0, 2}) {
		t.Fatalf("lendable %v, reclaimed %v; want [6 2 2 0], [0 4 0 2]", lendable, reclaimed)
	}
	for _, p := range owner {
		if !p.running() || strings.Contains(p.out.String(), "term") {
			t.Fatalf("alice's process was signalled: %v %q", p.err, p.out.String())
		}
	}
	// Only the owner (or an admin) advances; past the last stage it ends.
	if out, code := n.gpulet(t, n.bob, "advance", "wf1"); code != 1 || !strings.Contains(out, "forbidden") {
		t.Fatalf("bob advancing alice's reservation: exit %d: %s", code, out)
	}
	if out, code := n.gpulet(t, n.alice, "advance", "wf1"); code != 0 || !strings.Contains(out, "it ended") {
		t.Fatalf("advance past the last stage: exit %d: %s", code, out)
	}
	if s := n.snapshot(t); s.UnitsReserved != 0 || len(s.Reservations) != 0 || s.UnitsFree != 0 {
		t.Fatalf("after the end: reserved %d, free %d (alice's 8 go on), %+v", s.UnitsReserved, s.UnitsFree, s.Reservations)
	}
}

// TestReservationsCompeteByPriority: on a full node, two pending
// reservations of different priorities wait; as units free, they are held
// for the higher one first, so that neither a waiting gpurun nor a stream of
// small leases takes them, and each is admitted once it has all it needs.
func TestReservationsCompeteByPriority(t *testing.T) {
	// Users may ask priorities up to 5 here; above, only admins.
	conf := filepath.Join(t.TempDir(), "gpulet.yaml")
	writeConfigFile(t, conf, "reservations:\n  max_user_priority: 5\n")
	n := startReserveNode(t, "--config", conf)
	ctx := e2e.Ctx(t)
	if out, code := n.gpulet(t, n.bob, "reserve", "jump", "--stages", "1", "--priority", "6"); code != 1 || !strings.Contains(out, "forbidden: priority: 6 is above 5") {
		t.Fatalf("a priority above the ceiling: exit %d: %s", code, out)
	}
	var fill []string
	for range 8 {
		l, err := n.d.Client.Lease(ctx, api.LeaseRequest{Units: 1, TTL: "10m"})
		if err != nil {
			t.Fatal(err)
		}
		fill = append(fill, l.ID)
	}
	if out, code := n.gpulet(t, n.alice, "reserve", "low", "--stages", "3", "--priority", "1", "--wait"); code != 0 || !strings.Contains(out, "low is pending") {
		t.Fatalf("reserve low: exit %d: %s", code, out)
	}
	if out, code := n.gpulet(t, n.bob, "reserve", "high", "--stages", "2,4", "--priority", "5", "--wait"); code != 0 || !strings.Contains(out, "high is pending") {
		t.Fatalf("reserve high: exit %d: %s", code, out)
	}
	if out, code := n.gpulet(t, n.alice, "reserve", "now", "--stages", "1"); code != 1 || !strings.Contains(out, "insufficient_units") {
		t.Fatalf("a reservation that cannot wait: exit %d: %s", code, out)
	}
	// bob's gpurun waits for a unit all along.
	waiter := n.spawn(t, n.bob, politeScript, "--wait", "60s")
	testutil.Eventually(t, "gpurun to wait", func() bool { return strings.Contains(waiter.out.String(), "gpurun: waiting up to") })
	release := func(k int) {
		for range k {
			if err := n.d.Client.Release(ctx, fill[0]); err != nil {
				t.Fatal(err)
			}
			fill = fill[1:]
			if _, err := n.d.Client.Lease(ctx, api.LeaseRequest{Units: 1, TTL: "10m"}); !errors.Is(err, client.ErrInsufficientUnits) {
				t.Fatalf("a small lease took a unit held for a pending reservation: %v", err)
			}
		}
	}
	release(3)
	if h, l := n.reservation(t, "high"), n.reservation(t, "low"); h.State != api.ReservationPending || h.Held != 3 || l.Held != 0 {
		t.Fatalf("3 freed: high %+v, low %+v", h.ReservationStatus, l.ReservationStatus)
	}
	if s := n.snapshot(t); s.UnitsReserved != 3 || s.UnitsFree != 0 {
		t.Fatalf("3 held: snapshot reserved %d, free %d", s.UnitsReserved, s.UnitsFree)
	}
	release(1)
	if h := n.reservation(t, "high"); h.State != api.ReservationActive || h.Reserved != 4 {
		t.Fatalf("4 freed: high %+v", h.ReservationStatus)
	}
	release(3)
	if l := n.reservation(t, "low"); l.State != api.ReservationActive || l.Reserved != 3 {
		t.Fatalf("7 freed: low %+v", l.ReservationStatus)
	}
	if strings.Contains(waiter.out.String(), "\nup\n") || !waiter.running() {
		t.Fatalf("the waiting gpurun got a unit held for a reservation: %q", waiter.out.String())
	}
	if err := n.d.Client.Release(ctx, fill[0]); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the waiting gpurun to run", func() bool { return strings.Contains(waiter.out.String(), "\nup\n") })
	out, _ := n.gpulet(t, n.alice, "reservations")
	for _, want := range []string{"high", "low", "active"} {
		if !strings.Contains(out, want) {
			t.Fatalf("gpulet reservations lacks %q:\n%s", want, out)
		}
	}
}

// TestReservationSurvivesRestartMidStage: a reservation and who borrows from
// it survive a restart of gpuletd; one killed with -9 in the middle of a
// reclaim goes on after it: the stubborn borrower still there is killed at
// the deadline set before the crash, and a borrower that exited while
// gpuletd was down is not signalled (its lease is not taken back).
func TestReservationSurvivesRestartMidStage(t *testing.T) {
	n := startReserveNode(t, "--reclaim-grace", "3s")
	if out, code := n.gpulet(t, n.alice, "reserve", "wf", "--stages", "2,5,8", "--share", n.bob.Name+":1"); code != 0 {
		t.Fatalf("reserve: exit %d: %s", code, out)
	}
	n.start(t, n.alice, politeScript, "--reservation", "wf")
	var bs []*proc
	for i := range 6 {
		script := politeScript
		if i == 5 {
			script = stubbornScript
		}
		bs = append(bs, n.start(t, n.bob, script, "--preemptible"))
	}
	before := n.reservation(t, "wf")
	// A plain restart: everything as it was.
	if err := n.d.Stop(); err != nil {
		t.Fatal(err)
	}
	bs[0].cmd.Process.Kill() // exits while gpuletd is down
	<-bs[0].done
	n.d.Restart()
	r := n.reservation(t, "wf")
	if r.State != api.ReservationActive || r.Stage != 0 || r.Reserved != 8 || r.InUse != 1 || r.Lent != 5 || !slices.EqualFunc(r.Units, before.Units, func(a, b api.ReservationUnits) bool {
		return a.UUID == b.UUID && slices.Equal(a.Units, b.Units)
	}) {
		t.Fatalf("after a restart: %+v (before %+v)", r, before)
	}
	if fi, err := os.Stat(filepath.Join(n.d.Dir, "state", "reservations.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("reservations file: %v, %v", fi, err)
	}
	// Stage 2 (5 units, lends 3) takes 2 of the 5 lent back: the newest,
	// stubborn, and the one before. A crash comes right after.
	t0 := time.Now()
	if out, code := n.gpulet(t, n.alice, "advance", "wf"); code != 0 || !strings.Contains(out, "took back 2") {
		t.Fatalf("advance: exit %d: %s", code, out)
	}
	n.d.Kill9()
	<-bs[4].done
	if !strings.Contains(bs[4].out.String(), "term") {
		t.Fatalf("polite borrower: %v %q", bs[4].err, bs[4].out.String())
	}
	stubborn := bs[5]
	testutil.Eventually(t, "the stubborn borrower told", func() bool { return strings.Contains(stubborn.out.String(), "term") })
	n.d.Restart()
	<-stubborn.done
	if stubborn.killedBy() != syscall.SIGKILL || stubborn.end.Sub(t0) < 2950*time.Millisecond || stubborn.end.Sub(t0) > 6*time.Second {
		t.Fatalf("stubborn borrower ended by %v %s after the advance; want SIGKILL about 3s after", stubborn.err, stubborn.end.Sub(t0))
	}
	testutil.Eventually(t, "the units back", func() bool { r := n.reservation(t, "wf"); return r.Lent == 3 && r.Reclaiming == 0 })
	r = n.reservation(t, "wf")
	if r.Stage != 1 || r.Reclaimed != 2 || r.Need != 5 || r.Lendable != 3 {
		t.Fatalf("after the crash: %+v", r.ReservationStatus)
	}
	for _, p := range bs[1:4] {
		if !p.running() || strings.Contains(p.out.String(), "term") {
			t.Fatalf("a borrower not taken back was signalled: %q", p.out.String())
		}
	}
	if !strings.Contains(n.d.Log.String(), "reservation kept across daemon restart") {
		t.Fatalf("log:\n%s", n.d.Log.String())
	}
}

// TestReservationBadInput: every bad request is a clear 400 or 409 naming
// what is wrong, and sets nothing aside; a full state dir refuses with 503
// and sets nothing aside either, until there is room again.
func TestReservationBadInput(t *testing.T) {
	stateDir := tmpfsRunDir(t, "16k")
	n := startReserveNode(t, "--state-dir", stateDir)
	ctx := e2e.Ctx(t)
	if out, code := n.gpulet(t, n.alice, "reserve", "wf", "--stages", "2,4", "--share", n.bob.Name); code != 0 {
		t.Fatalf("reserve: exit %d: %s", code, out)
	}
	for _, tc := range []struct {
		name, body string
		status     int
		msg        string
	}{
		{"empty stages", `{"name":"x","stages":[]}`, 400, "stages: empty"},
		{"zero units", `{"name":"x","stages":[2,0]}`, 400, "stages[1]: 0 units"},
		{"negative job", `{"name":"x","stages":[[2,-1]]}`, 400, "stages[0][1]: -1 units"},
		{"stage larger than the node", `{"name":"x","stages":[2,9]}`, 400, "stages[1]: 9 units, more than this node has (8)"},
		{"duplicate name", `{"name":"wf","stages":[1]}`, 409, `a reservation named \"wf\" exists already`},
		{"unknown user", `{"name":"x","stages":[1],"share":[{"user":"nobody-gpulet-test"}]}`, 400, `no user \"nobody-gpulet-test\"`},
		{"unknown group", `{"name":"x","stages":[1],"share":[{"user":"group:nogroup-gpulet-test"}]}`, 400, `no group \"nogroup-gpulet-test\"`},
		{"bad name", `{"name":"../x","stages":[1]}`, 400, "name:"},
		{"more than is free", `{"name":"x","stages":[5]}`, 409, "only 4 of the 5 unit(s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := n.d.HTTP().Post("http://gpulet/v1/reservations", "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || !strings.Contains(b.String(), tc.msg) {
				t.Fatalf("POST %s: %d %s; want %d containing %q", tc.body, resp.StatusCode, b.String(), tc.status, tc.msg)
			}
		})
	}
	if out, code := n.gpulet(t, n.alice, "reserve", "x", "--stages", ""); code != 2 || !strings.Contains(out, "--stages is empty") {
		t.Fatalf("gpulet reserve --stages '': exit %d: %s", code, out)
	}
	if out, code := n.gpurunAs(t, n.alice, "--reservation", "nope"); code != 125 || !strings.Contains(out, `no reservation named "nope"`) {
		t.Fatalf("gpurun --reservation nope: exit %d: %s", code, out)
	}
	s := n.snapshot(t)
	if s.UnitsReserved != 4 || len(s.Reservations) != 1 {
		t.Fatalf("after the refusals: reserved %d, %+v", s.UnitsReserved, s.Reservations)
	}
	// A full state dir: nothing is reserved, advanced or ended, and gpuletd
	// says why.
	fill := filepath.Join(stateDir, "fill")
	exec.Command("dd", "if=/dev/zero", "of="+fill, "bs=4096").Run()
	if _, err := n.d.Client.Reserve(ctx, api.ReservationRequest{Name: "y", Stages: []api.Stage{{Units: 1}}}); !errors.Is(err, client.ErrUnavailable) || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("reserve on a full state dir: %v", err)
	}
	if out, code := n.gpulet(t, n.alice, "advance", "wf"); code != 1 || !strings.Contains(out, "unavailable") {
		t.Fatalf("advance on a full state dir: exit %d: %s", code, out)
	}
	if s := n.snapshot(t); s.UnitsReserved != 4 || len(s.Reservations) != 1 || s.Reservations[0].Stage != 0 {
		t.Fatalf("a refused change changed something: %+v", s.Reservations)
	}
	os.Remove(fill)
	if out, code := n.gpulet(t, n.alice, "advance", "wf"); code != 0 {
		t.Fatalf("advance once there is room: exit %d: %s", code, out)
	}
	if out, code := n.gpulet(t, n.alice, "unreserve", "wf"); code != 0 {
		t.Fatalf("unreserve: exit %d: %s", code, out)
	}
	if s := n.snapshot(t); s.UnitsReserved != 0 || s.UnitsFree != 8 {
		t.Fatalf("after unreserve: %d reserved, %d free", s.UnitsReserved, s.UnitsFree)
	}
}

// gpurunAs runs gpurun ARGS -- true as u.
func (n *reserveNode) gpurunAs(t *testing.T, u e2e.User, args ...string) (string, int) {
	t.Helper()
	cmd := u.Command(exec.Command(n.gpurun, append(append([]string{"--socket", n.d.Socket}, args...), "--", "true")...))
	return e2e.Output(t, cmd)
}

// TestReservationInViewAndMetrics: the FUSE view and /metrics show the
// reservation as the snapshot does.
func TestReservationInViewAndMetrics(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("mounting the view directly needs root; runs as uid", os.Getuid())
	}
	d := e2e.Start(t, "--sim-gpus", "1xT4", "--units-per-client", "1", "--clients-per-instance", "8", "--mount", filepath.Join(t.TempDir(), "view"))
	ctx := e2e.Ctx(t)
	s, err := d.Client.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.View == nil || !s.View.Mounted {
		t.Skipf("the view is not mounted here: %+v", s.View)
	}
	if _, err := d.Client.Reserve(ctx, api.ReservationRequest{Name: "wf", Stages: []api.Stage{{Units: 2}, {Jobs: []int{3, 2}}}}); err != nil {
		t.Fatal(err)
	}
	view := s.View.Mount
	testutil.Eventually(t, "the view to show the reservation", func() bool {
		b, err := os.ReadFile(filepath.Join(view, "reserved_units"))
		return err == nil && string(b) == "5\n"
	})
	for file, want := range map[string]string{
		"gpus/0/units_reserved": "5\n",
		"free_units":            "3\n",
	} {
		if b, err := os.ReadFile(filepath.Join(view, file)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", file, b, err, want)
		}
	}
	b, err := os.ReadFile(filepath.Join(view, "reservations", "wf"))
	if err != nil || !strings.Contains(string(b), `"need":2`) || !strings.Contains(string(b), `"lendable":3`) {
		t.Fatalf("reservations/wf = %s, %v", b, err)
	}
	m, err := d.Client.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`gpulet_node_units_reserved 5`, `gpulet_reservation_units_lendable{reservation="wf"} 3`, `gpulet_units_reserved{gpu="0"`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}
