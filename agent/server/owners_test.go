package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
)

// leasesCore lists two leases as the engine does: to admins all, to others
// their own.
type leasesCore struct{ *fakeCore }

func (leasesCore) List(peer identity.Peer) []api.Lease {
	all := []api.Lease{
		{ID: "l-1", Owner: api.Owner{UID: 1000, PID: 5}, Units: []int{0}, Env: map[string]string{"CUDA_MPS_PIPE_DIRECTORY": "/p"}},
		{ID: "l-2", Owner: api.Owner{UID: 2000, PID: 6}, Units: []int{1}, Task: "train", Labels: map[string]string{"k": "v"}, Env: map[string]string{"CUDA_MPS_PIPE_DIRECTORY": "/q"}},
	}
	var out []api.Lease
	for _, l := range all {
		if peer.Admin || l.Owner.UID == peer.UID {
			out = append(out, l)
		}
	}
	return out
}

func listAs(t *testing.T, srv *Server, query string) (int, []api.Lease) {
	t.Helper()
	req := httptest.NewRequest("GET", "/v1/leases"+query, nil)
	req = req.WithContext(context.WithValue(req.Context(), connKey{}, &connInfo{peer: identity.Peer{UID: 1000, GID: 1000, PID: 1}}))
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	var l api.LeaseList
	if rec.Code == 200 {
		if err := json.Unmarshal(rec.Body.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
	}
	return rec.Code, l.Leases
}

// Every user of the socket sees every lease's owner with ?all=true, but not
// another's id, env or labels; --private-leases keeps them to their own.
func TestLeasesAllShowsOwners(t *testing.T) {
	srv := New(partsOf(leasesCore{newFakeCore(t)}), -1, slog.New(slog.DiscardHandler))
	if code, ls := listAs(t, srv, ""); code != 200 || len(ls) != 1 || ls[0].ID != "l-1" {
		t.Fatalf("without all: %d %+v", code, ls)
	}
	code, ls := listAs(t, srv, "?all=true")
	if code != 200 || len(ls) != 2 {
		t.Fatalf("all: %d %+v", code, ls)
	}
	if own := ls[0]; own.ID != "l-1" || own.Env == nil {
		t.Errorf("the caller's own lease lost something: %+v", own)
	}
	if other := ls[1]; other.ID != "" || other.Env != nil || other.Labels != nil || other.Owner.UID != 2000 || other.Owner.PID != 6 || other.Task != "train" || len(other.Units) != 1 {
		t.Errorf("another's lease: %+v", other)
	}
	if code, _ := listAs(t, srv, "?all=yes"); code != 400 {
		t.Errorf("all=yes: %d, want 400", code)
	}
	srv.PrivateLeases = true
	if code, ls := listAs(t, srv, "?all=true"); code != 200 || len(ls) != 1 || ls[0].ID != "l-1" {
		t.Fatalf("under --private-leases: %d %+v", code, ls)
	}
}
