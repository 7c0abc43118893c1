package test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/client"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

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
