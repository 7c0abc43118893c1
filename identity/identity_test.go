package identity

import (
	"fmt"
	"math/rand/v2"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]string{
		"*":                            "everyone *",
		"alice":                        "user alice",
		"bob.smith":                    "user bob.smith",
		"svc$":                         "user svc$",
		"ann@corp":                     "user ann@corp",
		"1001":                         "user 1001 id 1001",
		"0":                            "user 0 id 0",
		"4294967294":                   "user 4294967294 id 4294967294",
		"group:ml":                     "group group:ml",
		"group:2000":                   "group group:2000 id 2000",
		"":                             `error empty: write a user name, group:NAME or a uid`,
		"group:":                       `error "group:" names no group: write group:NAME`,
		"4294967295":                   "error user id 4294967295 is out of range (0 to 4294967294)",
		"group:9999999999":             "error group id 9999999999 is out of range (0 to 4294967294)",
		"-bob":                         `error user name "-bob" starts with -: write a user name, group:NAME or a uid`,
		"a/b":                          `error user name "a/b" holds a character other than letters, digits and . _ - @ $: write a user name, group:NAME or a uid`,
		"group:x y":                    `error group name "x y" holds a character other than letters, digits and . _ - @ $: write a user name, group:NAME or a uid`,
		strings.Repeat("a", MaxName+1): "error user name \"" + strings.Repeat("a", 64) + "…\" is longer than 256 bytes: write a user name, group:NAME or a uid",
	} {
		p, err := Parse(in)
		got := ""
		switch {
		case err != nil:
			got = "error " + err.Error()
		case p.ByID:
			got = fmt.Sprintf("%s %s id %d", p.Kind, p, p.ID)
		default:
			got = fmt.Sprintf("%s %s", p.Kind, p)
		}
		if got != want {
			t.Errorf("Parse(%q) = %s, want %s", in, got, want)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"*", "alice", "group:ml", "1001", "group:2000", "4294967295", "-x", "group:", "a b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := Parse(s)
		if err != nil {
			return
		}
		// What parses is written back as it was, and parses to the same.
		if p.String() != s {
			t.Fatalf("Parse(%q).String() = %q", s, p.String())
		}
		if again, err := Parse(p.String()); err != nil || again != p {
			t.Fatalf("%q parsed to %+v, then to %+v (%v)", s, p, again, err)
		}
		if p.Kind != Everyone && (p.Name == "" || p.ByID && p.ID == ^uint32(0)) {
			t.Fatalf("%q parsed to %+v", s, p)
		}
	})
}

func TestPeerGroups(t *testing.T) {
	p := Peer{UID: 1000, GID: 1000, Groups: []uint32{27, 1000, 1001}}
	for gid, want := range map[uint32]bool{1000: true, 27: true, 1001: true, 0: false, 4: false} {
		if p.InGroup(gid) != want {
			t.Errorf("InGroup(%d) = %v, want %v", gid, !want, want)
		}
	}
	if got := p.GIDs(); !slices.Equal(got, []uint32{1000, 27, 1001}) {
		t.Fatalf("GIDs %v, want the primary first, each once", got)
	}
}

func TestMatches(t *testing.T) {
	alice := Principal{Kind: User, Name: "alice", ID: 1000}
	ml := Principal{Kind: Group, Name: "ml", ID: 50}
	for _, tc := range []struct {
		p    Principal
		uid  uint32
		gids []uint32
		want bool
	}{
		{alice, 1000, nil, true},
		{alice, 1001, []uint32{1000}, false}, // a gid is not a uid
		{ml, 1001, []uint32{1001, 50}, true},
		{ml, 50, []uint32{1001}, false}, // a uid is not a gid
		{Principal{Kind: Everyone}, 7, nil, true},
		{Principal{}, 0, []uint32{0}, false},
	} {
		if got := tc.p.Matches(tc.uid, tc.gids); got != tc.want {
			t.Errorf("%v.Matches(%d, %v) = %v, want %v", tc.p, tc.uid, tc.gids, got, tc.want)
		}
	}
}

type fakeDirectory map[string]uint32

func (d fakeDirectory) LookupUser(name string) (uint32, error) { return d.look("user", name) }
func (d fakeDirectory) LookupGroup(name string) (uint32, error) {
	return d.look("group", name)
}
func (d fakeDirectory) look(kind, name string) (uint32, error) {
	if id, ok := d[kind+":"+name]; ok {
		return id, nil
	}
	return 0, fmt.Errorf("no %s %q on this machine", kind, name)
}

func TestResolve(t *testing.T) {
	dir := fakeDirectory{"user:alice": 1000, "group:ml": 50, "group:alice": 77}
	for in, want := range map[string]string{"alice": "1000", "group:ml": "50", "group:alice": "77", "1234": "1234", "group:9": "9", "*": "0",
		"bob": `error no user "bob" on this machine`, "group:ops": `error no group "ops" on this machine`} {
		p, _ := Parse(in)
		r, err := p.Resolve(dir)
		got := strconv.Itoa(int(r.ID))
		if err != nil {
			got = "error " + err.Error()
		}
		if got != want {
			t.Errorf("Resolve(%s) = %s, want %s", in, got, want)
		}
	}
}

func TestSystemDirectory(t *testing.T) {
	var dir SystemDirectory
	if uid, err := dir.LookupUser("root"); err != nil || uid != 0 {
		t.Fatalf("root: %d, %v", uid, err)
	}
	if gid, err := dir.LookupGroup("root"); err != nil || gid != 0 {
		t.Fatalf("group root: %d, %v", gid, err)
	}
	if _, err := dir.LookupUser("gpulet-no-such-user"); err == nil || err.Error() != `no user "gpulet-no-such-user" on this machine` {
		t.Fatalf("unknown user: %v", err)
	}
	if _, err := dir.LookupGroup("gpulet-no-such-group"); err == nil || err.Error() != `no group "gpulet-no-such-group" on this machine` {
		t.Fatalf("unknown group: %v", err)
	}
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	if uid, err := dir.LookupUser(me.Username); err != nil || strconv.Itoa(int(uid)) != me.Uid {
		t.Fatalf("%s: %d, %v; want %s", me.Username, uid, err, me.Uid)
	}
}

// TestIndexAgreesWithAllows: the index placement asks on every lease marks
// exactly the sets whose Allows says yes, for random sets and callers.
func TestIndexAgreesWithAllows(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	ids := func(n int) []uint32 {
		var out []uint32
		for range r.IntN(n) {
			out = append(out, uint32(r.IntN(20)))
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	for range 2000 {
		sets := make([]*Set, r.IntN(6))
		for i := range sets {
			sets[i] = &Set{Everyone: r.IntN(5) == 0, UIDs: ids(4), GIDs: ids(4)}
		}
		ix := NewIndex(sets)
		uid, gids := uint32(r.IntN(20)), ids(4)
		marked := make([]bool, len(sets))
		ix.Mark(marked, uid, gids)
		for i, s := range sets {
			if marked[i] != s.Allows(uid, gids) {
				t.Fatalf("set %+v, caller %d in %v: index %v, Allows %v", *s, uid, gids, marked[i], s.Allows(uid, gids))
			}
		}
	}
}
