package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
)

func TestParseStages(t *testing.T) {
	got, err := ParseStages("2, 3+1+2 ,6,8")
	want := []api.Stage{{Units: 2}, {Jobs: []int{3, 1, 2}}, {Units: 6}, {Units: 8}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseStages = %+v, %v; want %+v", got, err, want)
	}
	b, _ := json.Marshal(got)
	if string(b) != "[2,[3,1,2],6,8]" {
		t.Fatalf("stages as JSON: %s", b)
	}
	for _, bad := range []struct{ in, want string }{
		{"", "--stages is empty"},
		{"2,,6", `stage 2 ("")`},
		{"2,0", `stage 2 ("0")`},
		{"-1", `stage 1 ("-1")`},
		{"2,3+", `stage 2 ("3+")`},
		{"x", `stage 1 ("x")`},
	} {
		if _, err := ParseStages(bad.in); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseStages(%q) = %v, want an error containing %q", bad.in, err, bad.want)
		}
	}
}

func TestParseShare(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []api.ShareMember
	}{
		{"", nil},
		{"bob:1,group:ml:2", []api.ShareMember{{User: "bob", Weight: 1}, {User: "group:ml", Weight: 2}}},
		{"bob,carol", []api.ShareMember{{User: "bob"}, {User: "carol"}}},
		{"group:123", []api.ShareMember{{User: "group:123"}}},
		{" group:ml , bob:3", []api.ShareMember{{User: "group:ml"}, {User: "bob", Weight: 3}}},
	} {
		got, err := ParseShare(tc.in)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseShare(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []struct{ in, want string }{
		{"bob:x", `--share "bob:x": the weight`},
		{"bob:0", `--share "bob:0": the weight`},
		{"group:", `--share "group:": give a user name`},
		{"bob,,carol", `--share "": give a user name`},
		{":2", `--share ":2": give a user name`},
	} {
		if _, err := ParseShare(bad.in); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseShare(%q) = %v, want an error containing %q", bad.in, err, bad.want)
		}
	}
}

func FuzzParseStages(f *testing.F) {
	for _, s := range []string{"2,6,6,8", "3+1,2", "", ",", "1+", "99999999999999999999", "-1,+2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		stages, err := ParseStages(s)
		if err != nil {
			return
		}
		for _, st := range stages {
			if st.Jobs == nil && st.Units < 1 {
				t.Fatalf("%q: stage %+v", s, st)
			}
			for _, j := range st.Jobs {
				if j < 1 {
					t.Fatalf("%q: job of %d", s, j)
				}
			}
		}
	})
}

func FuzzParseShare(f *testing.F) {
	for _, s := range []string{"bob:1,group:ml:2", "group:123", "a:b:c", ":", "group::1", "x,", "bob:-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ms, err := ParseShare(s)
		if err != nil {
			return
		}
		for _, m := range ms {
			if strings.TrimPrefix(m.User, "group:") == "" || m.Weight < 0 {
				t.Fatalf("%q: member %+v", s, m)
			}
		}
	})
}

// reservationDaemon answers the reservation endpoints with fixed
// reservations, and records what it was asked.
func reservationDaemon(t *testing.T, asked *[]string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	active := api.Reservation{ReservationStatus: api.ReservationStatus{Name: "wf1", State: api.ReservationActive, Priority: 10,
		Reserved: 8, Stage: 1, Stages: 4, Need: 6, InUse: 6, Lendable: 2, Lent: 2, Reclaiming: 1, Reclaimed: 4},
		Owner: api.ReservationOwner{UID: 1000}, Needs: []int{2, 6, 6, 8},
		Share: []api.ShareMember{{User: "bob", Weight: 1}, {User: "group:ml", Weight: 2}}, LentTo: map[string]int{"group:ml": 2}}
	pending := api.Reservation{ReservationStatus: api.ReservationStatus{Name: "wf2", State: api.ReservationPending, Held: 3, Stages: 1, Need: 5},
		Needs: []int{5}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		body.ReadFrom(r.Body)
		*asked = append(*asked, r.Method+" "+r.URL.Path+" "+body.String())
		w.Header().Set("Content-Type", "application/json")
		switch r.Method + " " + r.URL.Path {
		case "GET /v1/reservations":
			json.NewEncoder(w).Encode(api.ReservationList{Reservations: []api.Reservation{active, pending}})
		case "POST /v1/reservations":
			var req api.ReservationRequest
			json.Unmarshal(body.Bytes(), &req)
			w.WriteHeader(http.StatusCreated)
			if req.Wait {
				json.NewEncoder(w).Encode(pending)
				return
			}
			a := active
			a.Stage, a.Need, a.Lendable = 0, 2, 6
			json.NewEncoder(w).Encode(a)
		case "POST /v1/reservations/wf1/advance":
			json.NewEncoder(w).Encode(active)
		case "POST /v1/reservations/last/advance":
			json.NewEncoder(w).Encode(api.Reservation{ReservationStatus: api.ReservationStatus{Name: "last", State: api.ReservationEnded}})
		case "DELETE /v1/reservations/wf1":
			w.WriteHeader(http.StatusNoContent)
		default:
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(api.ErrorBody{Error: api.ErrorDetail{Code: api.CodeNotFound, Message: "no reservation named \"" + filepath.Base(filepath.Dir(r.URL.Path)) + "\""}})
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

func TestReservationCommands(t *testing.T) {
	var asked []string
	sock := reservationDaemon(t, &asked)
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
		asked  string
	}{
		{"reserve", []string{"reserve", "wf1", "--stages", "2,3+3,6,8", "--share", "bob:1,group:ml:2", "--priority", "10"}, ExitOK,
			"reserved wf1: 8 unit(s) set aside; stage 1 of 4 needs 2, lends 6\n", "",
			`POST /v1/reservations {"name":"wf1","stages":[2,[3,3],6,8],"priority":10,"share":[{"user":"bob","weight":1},{"user":"group:ml","weight":2}]}`},
		{"reserve waiting", []string{"reserve", "wf2", "--stages", "5", "--wait"}, ExitOK, "wf2 is pending: it waits for 5 unit(s) (3 held so far)", "",
			`POST /v1/reservations {"name":"wf2","stages":[5],"wait":true}`},
		{"reserve without stages", []string{"reserve", "wf3"}, ExitUsage, "", "--stages is required", ""},
		{"reserve with bad stages", []string{"reserve", "wf3", "--stages", "2,0"}, ExitUsage, "", `stage 2 ("0")`, ""},
		{"reserve with a bad share", []string{"reserve", "wf3", "--stages", "2", "--share", "bob:x"}, ExitUsage, "", `--share "bob:x"`, ""},
		{"reserve without a name", []string{"reserve", "--stages", "2"}, ExitUsage, "", "wrong number of arguments", ""},
		{"reservations", []string{"reservations"}, ExitOK, "wf1   active   1000", "", "GET /v1/reservations "},
		{"advance", []string{"advance", "wf1"}, ExitOK, "wf1: stage 2 of 4 started, needs 6, lends 2; took back 4 lent unit(s) (1 still with borrowers that got SIGTERM)\n", "", "POST /v1/reservations/wf1/advance "},
		{"advance past the last", []string{"advance", "last"}, ExitOK, "last: past its last stage, it ended", "", ""},
		{"advance unknown", []string{"advance", "nope"}, ExitFailure, "", "gpulet: not_found: no reservation named \"nope\"", ""},
		{"unreserve", []string{"unreserve", "wf1"}, ExitOK, "ended wf1", "", "DELETE /v1/reservations/wf1 "},
		{"help of reserve", []string{"help", "reserve"}, ExitOK, "--share", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asked = nil
			var out, errb bytes.Buffer
			code := Run(context.Background(), append([]string{"--socket", sock}, tc.args...), &out, &errb)
			if code != tc.code || !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errb.String(), tc.stderr) {
				t.Fatalf("gpulet %q: exit %d\nstdout %q\nstderr %q\nwant %d, %q, %q", tc.args, code, out.String(), errb.String(), tc.code, tc.stdout, tc.stderr)
			}
			if tc.asked != "" && (len(asked) != 1 || strings.TrimSpace(asked[0]) != strings.TrimSpace(tc.asked)) {
				t.Fatalf("asked %q, want %q", asked, tc.asked)
			}
		})
	}
}

func TestWriteReservations(t *testing.T) {
	var asked []string
	sock := reservationDaemon(t, &asked)
	var out bytes.Buffer
	if code := Run(context.Background(), []string{"--socket", sock, "reservations"}, &out, &bytes.Buffer{}); code != ExitOK {
		t.Fatal(code)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("table:\n%s", out.String())
	}
	for _, want := range []string{"2/4", "1 ending", "bob:1,group:ml:2 (2)"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("row %q lacks %q", lines[1], want)
		}
	}
	if !strings.Contains(lines[2], "3 held of 5") || !strings.Contains(lines[2], "pending") {
		t.Errorf("pending row %q", lines[2])
	}
	out.Reset()
	WriteReservations(&out, nil)
	if out.String() != "no reservations\n" {
		t.Errorf("empty: %q", out.String())
	}
}

func TestStatusShowsReservations(t *testing.T) {
	var out bytes.Buffer
	WriteStatus(&out, &api.Snapshot{Node: "n", UnitsTotal: 16, UnitsFree: 4, UnitsReserved: 4,
		GPUs: []api.GPU{{Index: 0, UnitsTotal: 16, UnitsUsed: 8, UnitsReserved: 4, UnitsFree: 4}},
		Reservations: []api.ReservationStatus{
			{Name: "wf1", State: api.ReservationActive, Reserved: 8, Stage: 1, Stages: 4, Need: 6, InUse: 4, Lendable: 2, Lent: 2, Reclaimed: 4},
			{Name: "wf2", State: api.ReservationPending, Priority: 3, Held: 2},
		}})
	for _, want := range []string{"[########rrrr....]", "8/0/4/4", "16 units, 4 free, 4 reserved",
		"reservation wf1: stage 2/4 needs 6 of 8 reserved; in use 4, lent 2 of 2 lendable, reclaimed 4",
		"reservation wf2: pending, priority 3, 2 unit(s) held for it"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
}
