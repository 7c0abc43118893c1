package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/placement"
)

// fakeDirectory knows the users and groups it holds, and counts lookups.
type fakeDirectory struct {
	users, groups map[string]uint32
	lookups       int
}

func (d *fakeDirectory) LookupUser(name string) (uint32, error) {
	d.lookups++
	if id, ok := d.users[name]; ok {
		return id, nil
	}
	if name == "broken" {
		return 0, errors.New("looking up user \"broken\": the directory is down")
	}
	return 0, fmt.Errorf("no user %q on this machine", name)
}

func (d *fakeDirectory) LookupGroup(name string) (uint32, error) {
	d.lookups++
	if id, ok := d.groups[name]; ok {
		return id, nil
	}
	return 0, fmt.Errorf("no group %q on this machine", name)
}

func newDirectory() *fakeDirectory {
	return &fakeDirectory{
		users:  map[string]uint32{"alice": 1001, "bob": 1002, "carol": 1003},
		groups: map[string]uint32{"ml": 2000, "ops": 2001},
	}
}

// threeGPUs is a node with GPUs 0-2.
var threeGPUs = []GPURef{{0, "GPU-aaaa"}, {1, "GPU-bbbb"}, {2, "GPU-cccc"}}

func mustParse(t *testing.T, s string) *File {
	t.Helper()
	f, err := Parse([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestResolveDesignExample(t *testing.T) {
	r, err := mustParse(t, designExample).Resolve(threeGPUs, newDirectory())
	if err != nil {
		t.Fatal(err)
	}
	want := &Rules{
		Pools: []placement.Pool{
			{Name: "inference", GPUs: []int{2}, Set: identity.Set{Everyone: true}},
			{Name: "training", GPUs: []int{0, 1}, Set: identity.Set{UIDs: []uint32{1001}, GIDs: []uint32{2000}}},
		},
		Quotas: []Quota{
			{Key: "alice", Kind: identity.User, ID: 1001, Limit: 8},
			{Key: "group:ml", Kind: identity.Group, ID: 2000, Limit: 24},
			{Key: "*", Kind: identity.Everyone, Limit: 64},
		},
		Profiles: map[string]map[string]time.Duration{"resnet50": {"NVIDIA A100-SXM4-80GB": 95 * time.Second, "Tesla T4": 410 * time.Second}},
		Weights:  placement.DefaultWeights,
	}
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("got  %+v\nwant %+v", r, want)
	}
}

func TestResolveSetsAndIDs(t *testing.T) {
	f := mustParse(t, lines(
		"pools:",
		"  p:",
		"    gpus: [2, GPU-AAAA, 0, gpu-cccc]", // GPU 2 by index and by UUID
		"    users: [bob, 1002, alice, 'group:ops', 'group:2001', 'group:7', 500]",
		"quotas:",
		"  '1002': 3",
		"  'group:7': 4",
		"score: {clock: 1}",
	))
	r, err := f.Resolve(threeGPUs, newDirectory())
	if err != nil {
		t.Fatal(err)
	}
	p := r.Pools[0]
	if !reflect.DeepEqual(p.GPUs, []int{0, 2}) || !reflect.DeepEqual(p.UIDs, []uint32{500, 1001, 1002}) || !reflect.DeepEqual(p.GIDs, []uint32{7, 2001}) {
		t.Fatalf("pool %+v", p)
	}
	if want := []Quota{{"1002", identity.User, 1002, 3}, {"group:7", identity.Group, 7, 4}}; !reflect.DeepEqual(r.Quotas, want) {
		t.Fatalf("quotas %+v", r.Quotas)
	}
	if r.Weights != (placement.Weights{Clock: 1}) {
		t.Fatalf("weights %+v", r.Weights)
	}
}

func lines(ls ...string) string { return strings.Join(ls, "\n") + "\n" }

func TestResolveLooksEachNameUpOnce(t *testing.T) {
	dir := newDirectory()
	f := mustParse(t, lines(
		"pools:",
		"  a: {gpus: [0], users: [alice, 'group:ml']}",
		"  b: {gpus: [1], users: [alice, 'group:ml']}",
		"quotas: {alice: 1, 'group:ml': 2, '1001': 3}",
	))
	if _, err := f.Resolve(threeGPUs, dir); err != nil {
		t.Fatal(err)
	}
	if dir.lookups != 2 {
		t.Fatalf("%d lookups for one user and one group", dir.lookups)
	}
}

func TestResolveErrors(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		line     int
		want     string
	}{
		{"unknown index", "pools:\n  p:\n    gpus: [0, 3]\n", 3, "pools.p.gpus[1]: no GPU with index 3 (this node has 3)"},
		{"unknown UUID", "pools:\n  p:\n    gpus:\n    - GPU-aaaa\n    - GPU-dddd\n", 5, `pools.p.gpus[1]: no GPU with UUID "GPU-dddd" on this node`},
		{"unknown user", "pools:\n  p:\n    gpus: [0]\n    users: [alice, mallory]\n", 4, `pools.p.users[1]: no user "mallory" on this machine`},
		{"unknown group", "pools:\n  p:\n    gpus: [0]\n    users: ['group:nope']\n", 4, `pools.p.users[0]: no group "nope" on this machine`},
		{"unknown quota user", "quotas:\n  alice: 1\n  mallory: 2\n", 3, `quotas.mallory: no user "mallory" on this machine`},
		{"unknown quota group", "quotas:\n  'group:nope': 2\n", 2, `quotas."group:nope": no group "nope" on this machine`},
		{"directory failing", "quotas:\n  broken: 2\n", 2, `quotas.broken: looking up user "broken": the directory is down`},
		// Pools are met one by one, users before GPUs; the earliest line wins.
		{"earliest line first", lines(
			"pools:",
			"  p:",
			"    gpus: [9]",
			"    users: [mallory]",
			"quotas:",
			"  eve: 1",
		), 3, "pools.p.gpus[0]: no GPU with index 9"},
		{"a later pool's GPU before a quota", lines(
			"quotas:",
			"  eve: 1",
			"pools:",
			"  p: {gpus: [9]}",
		), 2, `quotas.eve: no user "eve"`},
		{"the same unknown name twice", lines(
			"pools:",
			"  a: {gpus: [0], users: [mallory]}",
			"  b: {gpus: [0], users: [mallory]}",
		), 2, "pools.a.users[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The problem on the earliest line, names included, as
			// CheckNames reports it.
			r, res := mustParse(t, tc.in).resolve(threeGPUs, true, newDirectory())
			e := res.first
			if e == nil {
				t.Fatalf("got %+v; want a problem", r)
			}
			if e.Line != tc.line || !strings.Contains(e.Msg, tc.want) {
				t.Fatalf("got line %d: %q\nwant line %d: ...%q...", e.Line, e.Msg, tc.line, tc.want)
			}
		})
	}
}

// TestResolveSkipsUnknownNames: a name the directory does not resolve
// (deleted since, or the directory down) skips its rule, fail-closed, and
// says so; a GPU the node lacks stays an error.
func TestResolveSkipsUnknownNames(t *testing.T) {
	f := mustParse(t, lines(
		"pools:",
		"  p:",
		"    gpus: [0]",
		"    users: [alice, mallory, 'group:nope']",
		"  only:",
		"    gpus: [1]",
		"    users: [broken]",
		"quotas:",
		"  mallory: 1",
		"  alice: 2",
		"  'group:nope': 3",
	))
	r, err := f.Resolve(threeGPUs, newDirectory())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`line 4: pools.p.users[1]: no user "mallory" on this machine; the pool's entry is skipped`,
		`line 4: pools.p.users[2]: no group "nope" on this machine; the pool's entry is skipped`,
		`line 7: pools.only.users[0]: looking up user "broken": the directory is down; the pool's entry is skipped`,
		`line 9: quotas.mallory: no user "mallory" on this machine; the quota is skipped`,
		`line 11: quotas."group:nope": no group "nope" on this machine; the quota is skipped`,
	}
	if !reflect.DeepEqual(r.Skipped, want) {
		t.Fatalf("skipped:\n%s\nwant:\n%s", strings.Join(r.Skipped, "\n"), strings.Join(want, "\n"))
	}
	p, _ := r.Pool("p")
	if !reflect.DeepEqual(p.UIDs, []uint32{1001}) || len(p.GIDs) != 0 || p.Everyone {
		t.Fatalf("pool p: %+v", p)
	}
	// A pool whose every user is skipped is left to admins, not opened.
	only, _ := r.Pool("only")
	if only.Everyone || only.Allows(1002, []uint32{2000}) {
		t.Fatalf("pool only: %+v", only)
	}
	if len(r.Quotas) != 1 || r.Quotas[0].Key != "alice" || r.Quotas[0].ID != 1001 {
		t.Fatalf("quotas: %+v", r.Quotas)
	}
	if err := f.CheckNames(newDirectory()); err == nil || err.Error() != `line 4: pools.p.users[1]: no user "mallory" on this machine` {
		t.Fatalf("CheckNames: %v", err)
	}
	if err := f.Check(threeGPUs, newDirectory()); err == nil || err.Error() != `line 4: pools.p.users[1]: no user "mallory" on this machine` {
		t.Fatalf("Check: %v", err)
	}
	// A GPU the node lacks is still an error, even beside skipped names.
	if _, err := mustParse(t, "pools:\n  p: {gpus: [9], users: [mallory]}\n").Resolve(threeGPUs, newDirectory()); err == nil || !strings.Contains(err.Error(), "no GPU with index 9") {
		t.Fatalf("unknown GPU: %v", err)
	}
}

func TestResolveNoGPUs(t *testing.T) {
	_, err := mustParse(t, "pools:\n  p: {gpus: [0]}\n").Resolve(nil, newDirectory())
	if err == nil || err.Error() != "line 2: pools.p.gpus[0]: no GPU with index 0 (this node has 0)" {
		t.Fatalf("%v", err)
	}
}

func TestCheckNames(t *testing.T) {
	f := mustParse(t, "pools:\n  p:\n    gpus: [7, GPU-zzzz]\n    users: [alice, 'group:ml']\n")
	if err := f.CheckNames(newDirectory()); err != nil {
		t.Fatalf("GPUs were checked: %v", err)
	}
	f = mustParse(t, "pools:\n  p:\n    gpus: [7]\n    users: [alice, 'group:wizards']\n")
	if err := f.CheckNames(newDirectory()); err == nil || err.Error() != `line 4: pools.p.users[1]: no group "wizards" on this machine` {
		t.Fatalf("%v", err)
	}
}

// TestResolveCopiesProfiles: Rules outlive changes to the File they came from.
func TestResolveCopiesProfiles(t *testing.T) {
	f := mustParse(t, designExample)
	r, err := f.Resolve(threeGPUs, newDirectory())
	if err != nil {
		t.Fatal(err)
	}
	f.Profiles["resnet50"]["Tesla T4"] = time.Hour
	if r.Profiles["resnet50"]["Tesla T4"] != 410*time.Second {
		t.Fatal("Rules share the File's profiles")
	}
}

// TestResolveWithSystemDirectory: names in the file resolve through this
// machine's user database (identity.SystemDirectory).
func TestResolveWithSystemDirectory(t *testing.T) {
	r, err := mustParse(t, "pools:\n  p: {gpus: [0], users: [root, 'group:root']}\n").Resolve([]GPURef{{0, "GPU-a"}}, identity.SystemDirectory{})
	if err != nil || !reflect.DeepEqual(r.Pools[0].UIDs, []uint32{0}) || !reflect.DeepEqual(r.Pools[0].GIDs, []uint32{0}) {
		t.Fatalf("%+v, %v", r, err)
	}
}

func TestUserPriorityCeiling(t *testing.T) {
	var none *Rules
	if got := none.UserPriorityCeiling(); got != DefaultMaxUserPriority {
		t.Fatalf("no config: %d", got)
	}
	for in, want := range map[string]int{"quotas: {}\n": DefaultMaxUserPriority, "reservations:\n  max_user_priority: 50\n": 50, "reservations: {max_user_priority: -3}\n": -3} {
		r, err := mustParse(t, in).Resolve(threeGPUs, newDirectory())
		if err != nil || r.UserPriorityCeiling() != want {
			t.Fatalf("%q: %v, %v; want %d", in, r, err, want)
		}
	}
}
