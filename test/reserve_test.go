package test

import (
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
	// The tests fill the GPU with busy jobs, which read 100% of its SMs as
	// on the H100 (docs/hardware.md); they are about reservations, not
	// --max-utilization, which stays out of the way.
	n.d = e2e.Start(t, append([]string{"--socket-group", sock.Name, "--sim-gpus", "1xT4", "--units-per-client", "1", "--clients-per-instance", "8", "--reclaim-grace", "1s", "--max-utilization", "100"}, extra...)...)
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
