package reserve

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
)

// TestWorkedExample is the example of docs/design.md §1.6: stages needing 2, 6, 6, 8, with
// borrowers taking every lendable unit at every stage: reserve 8; lendable
// 6, 2, 2, 0 after each stage starts; reclaimed 0, 4, 0, 2.
func TestWorkedExample(t *testing.T) {
	needs := []int{2, 6, 6, 8}
	size := Size(needs)
	if size != 8 {
		t.Fatalf("size %d, want 8", size)
	}
	var lendable, reclaimed []int
	lent := 0
	for _, need := range needs {
		r := ToReclaim(size, need, lent)
		lent -= r
		reclaimed = append(reclaimed, r)
		lendable = append(lendable, Lendable(size, need))
		// Borrowers take every lendable unit.
		lent = Lendable(size, need)
	}
	if !slices.Equal(lendable, []int{6, 2, 2, 0}) || !slices.Equal(reclaimed, []int{0, 4, 0, 2}) {
		t.Fatalf("lendable %v, reclaimed %v; want [6 2 2 0], [0 4 0 2]", lendable, reclaimed)
	}
}

func members(weights ...int) []Member {
	out := make([]Member, len(weights))
	for i, w := range weights {
		out[i] = Member{Name: fmt.Sprint("m", i), ID: uint32(1000 + i), Weight: w}
	}
	return out
}

func TestCaps(t *testing.T) {
	for _, tc := range []struct {
		lendable int
		weights  []int
		want     []int
	}{
		{6, []int{1, 1}, []int{3, 3}},
		{6, []int{1, 2}, []int{2, 4}},
		{7, []int{1, 1}, []int{4, 3}}, // the odd unit to the first listed
		{2, []int{1, 1, 1}, []int{1, 1, 0}},
		{10, []int{3, 1, 1}, []int{6, 2, 2}},
		{0, []int{1, 2}, []int{0, 0}},
		{5, []int{0, 0}, []int{5, 5}}, // no weights: first come, first served
	} {
		if got := Caps(tc.lendable, members(tc.weights...)); !slices.Equal(got, tc.want) {
			t.Errorf("Caps(%d, weights %v) = %v, want %v", tc.lendable, tc.weights, got, tc.want)
		}
	}
}

func TestReclaim(t *testing.T) {
	for _, tc := range []struct {
		name    string
		k       int
		held    []int
		weights []int
		want    []int
	}{
		{"even weights", 4, []int{3, 3}, []int{1, 1}, []int{2, 2}},
		{"by weight", 6, []int{4, 8}, []int{1, 2}, []int{2, 4}},
		{"a member holding less gives what it holds", 4, []int{1, 5}, []int{1, 1}, []int{1, 3}},
		{"a member holding nothing gives nothing", 2, []int{0, 3}, []int{5, 1}, []int{0, 2}},
		{"more than is held", 9, []int{2, 3}, []int{1, 1}, []int{2, 3}},
		{"no weights: first listed first", 4, []int{3, 3, 3}, []int{0, 0, 0}, []int{3, 1, 0}},
		{"no weights, first holds nothing", 2, []int{0, 3}, []int{0, 0}, []int{0, 2}},
		{"nothing to take", 0, []int{3, 3}, []int{1, 1}, []int{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Reclaim(tc.k, tc.held, members(tc.weights...)); !slices.Equal(got, tc.want) {
				t.Fatalf("Reclaim(%d, held %v, weights %v) = %v, want %v", tc.k, tc.held, tc.weights, got, tc.want)
			}
		})
	}
}

// TestApportionFollowsWeights: with enough held, each member's part is within
// one unit of its exact proportion, the parts add up, and no member gives more
// than it holds.
func TestApportionFollowsWeights(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		n := 1 + rng.IntN(6)
		weights := make([]int, n)
		held := make([]int, n)
		W, H := 0, 0
		for i := range weights {
			weights[i] = 1 + rng.IntN(9)
			held[i] = rng.IntN(40)
			W += weights[i]
			H += held[i]
		}
		k := rng.IntN(H + 5)
		got := Reclaim(k, held, members(weights...))
		sum := 0
		for i, g := range got {
			if g < 0 || g > held[i] {
				t.Fatalf("member %d gives %d of %d held", i, g, held[i])
			}
			sum += g
		}
		if sum != min(k, H) {
			t.Fatalf("Reclaim(%d, %v, %v) = %v: sums to %d", k, held, weights, got, sum)
		}
		caps := Caps(k, members(weights...))
		for i, c := range caps {
			exact := float64(k) * float64(weights[i]) / float64(W)
			if float64(c) < exact-1 || float64(c) > exact+1 {
				t.Fatalf("Caps(%d, %v) = %v: member %d gets %d, exact %.2f", k, weights, caps, i, c, exact)
			}
		}
	}
}

func TestMemberOf(t *testing.T) {
	share := []Member{{Name: "group:ml", Group: true, ID: 50}, {Name: "bob", ID: 1001}, {Name: "carol", ID: 1002}}
	for _, tc := range []struct {
		uid, gid uint32
		groups   []uint32
		want     int
	}{
		{1001, 1001, nil, 1},
		{1001, 1001, []uint32{50}, 0}, // bob in ml: the first listed
		{1003, 50, nil, 0},            // ml as the primary group
		{1002, 1002, []uint32{7}, 2},
		{1004, 1004, []uint32{7}, -1},
	} {
		if got := MemberOf(share, tc.uid, tc.gid, tc.groups); got != tc.want {
			t.Errorf("MemberOf(uid %d, gid %d, groups %v) = %d, want %d", tc.uid, tc.gid, tc.groups, got, tc.want)
		}
	}
}

func TestDecode(t *testing.T) {
	s, err := Decode(strings.NewReader(`{"name":"wf1","stages":[2,[3,1,2],6,8],"priority":10,"share":[{"user":"bob","weight":1},{"user":"group:ml","weight":2}],"wait":true}`))
	if err != nil {
		t.Fatal(err)
	}
	want := Spec{Name: "wf1", Needs: []int{2, 6, 6, 8}, Priority: 10, Wait: true,
		Share: []Member{{Name: "bob", Weight: 1}, {Name: "group:ml", Group: true, Weight: 2}}}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("got %+v\nwant %+v", s, want)
	}
	if s.Size() != 8 {
		t.Fatalf("size %d", s.Size())
	}
}

// TestDecodeRefuses: every bad request is a bad_request naming what is wrong.
func TestDecodeRefuses(t *testing.T) {
	long := strings.Repeat("a", MaxNameLen+1)
	many := "[" + strings.Repeat("1,", MaxStages) + "1]"
	for _, tc := range []struct{ body, want string }{
		{``, "empty"},
		{`{"name":"a","stages":[]}`, "stages: empty"},
		{`{"name":"a"}`, "stages: empty"},
		{`{"name":"a","stages":[2,0]}`, "stages[1]: 0 units"},
		{`{"name":"a","stages":[-3]}`, "stages[0]: -3 units"},
		{`{"name":"a","stages":[[]]}`, "stages[0]: no jobs"},
		{`{"name":"a","stages":[[2,0]]}`, "stages[0][1]: 0 units"},
		{`{"name":"a","stages":[2,"x"]}`, "stages[1]: must be a whole number"},
		{`{"name":"a","stages":[2.5]}`, "stages[0]: must be a whole number"},
		{`{"name":"a","stages":[[1,[2]]]}`, "stages[0]: must be a whole number"},
		{`{"name":"a","stages":` + many + `}`, "more than 256"},
		{`{"name":"","stages":[1]}`, "name: empty"},
		{`{"name":"` + long + `","stages":[1]}`, "name: longer"},
		{`{"name":"../x","stages":[1]}`, "name: \"../x\""},
		{`{"name":"-x","stages":[1]}`, "starting with a letter"},
		{`{"name":"a b","stages":[1]}`, "name:"},
		{`{"name":"a","stages":[1],"priority":1001}`, "priority: 1001"},
		{`{"name":"a","stages":[1],"share":[{"user":""}]}`, "share[0].user: empty"},
		{`{"name":"a","stages":[1],"share":[{"user":"group:"}]}`, `share[0].user: "group:" names no group`},
		{`{"name":"a","stages":[1],"share":[{"user":"bob"},{"user":"bob"}]}`, "share[1].user: \"bob\" is listed twice"},
		{`{"name":"a","stages":[1],"share":[{"user":"bob","weight":1},{"user":"carol"}]}`, "share[1].weight: give every member a weight, or none"},
		{`{"name":"a","stages":[1],"share":[{"user":"bob"},{"user":"carol","weight":2}]}`, "share[1].weight"},
		{`{"name":"a","stages":[1],"share":[{"user":"bob","weight":-1}]}`, "share[0].weight: -1"},
		{`{"name":"a","stages":[1],"share":[{"user":"a/b"}]}`, `user name "a/b" holds a character other than letters`},
		{`{"name":"a","stages":[1],"share":[{"user":"x:y"}]}`, `user name "x:y" holds a character other than letters`},
		// The config file's rule, the one rule (package identity).
		{`{"name":"a","stages":[1],"share":[{"user":"-bob"}]}`, `user name "-bob" starts with -`},
		{`{"name":"a","stages":[1],"share":[{"user":"4294967295"}]}`, "user id 4294967295 is out of range"},
		{`{"name":"a","stages":[1],"share":[{"user":"*"}]}`, `"*" is not a member`},
		{`{"name":"a","stages":[1],"share":[{"user":"group:ml"},{"user":"group:ml"}]}`, `"group:ml" is listed twice`},
		{`{"name":"a","stages":[1],"wait":"10s"}`, "wait: must be true or false"},
		{`{"name":"a","stages":[1],"units":3}`, `unknown field "units"`},
		{`{"name":"a","stages":[1]} {}`, "trailing data"},
		{`{"name":"a","stages":[1]`, "ends too early"},
		{`{"name":7,"stages":[1]}`, "name: must be a string"},
	} {
		_, err := Decode(strings.NewReader(tc.body))
		if !errors.Is(err, api.ErrBadRequest) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Decode(%s) = %v; want bad_request containing %q", tc.body, err, tc.want)
		}
	}
}

// TestWireRequestMatchesAPI keeps the decoder's own request type in step with
// the API's: the same JSON names, in the same order.
func TestWireRequestMatchesAPI(t *testing.T) {
	names := func(v any) []string {
		var out []string
		rt := reflect.TypeOf(v)
		for i := range rt.NumField() {
			out = append(out, rt.Field(i).Tag.Get("json"))
		}
		return out
	}
	if a, w := names(api.ReservationRequest{}), names(wireRequest{}); !slices.Equal(a, w) {
		t.Fatalf("api.ReservationRequest %v, wireRequest %v", a, w)
	}
}

type fakeAccounts map[string]uint32

func (f fakeAccounts) LookupUser(name string) (uint32, error) {
	if id, ok := f[name]; ok {
		return id, nil
	}
	return 0, errors.New("unknown user")
}

func (f fakeAccounts) LookupGroup(name string) (uint32, error) {
	if id, ok := f["group:"+name]; ok {
		return id, nil
	}
	return 0, errors.New("unknown group")
}

func TestResolve(t *testing.T) {
	acc := fakeAccounts{"bob": 1001, "group:ml": 50}
	s := Spec{Share: []Member{{Name: "bob"}, {Name: "group:ml", Group: true}}}
	if err := s.Resolve(acc); err != nil {
		t.Fatal(err)
	}
	if s.Share[0].ID != 1001 || s.Share[1].ID != 50 {
		t.Fatalf("resolved %+v", s.Share)
	}
	for _, tc := range []struct {
		m    Member
		want string
	}{
		{Member{Name: "mallory"}, `share[0].user: no user "mallory"`},
		{Member{Name: "group:ops", Group: true}, `share[0].user: no group "ops"`},
	} {
		s := Spec{Share: []Member{tc.m}}
		if err := s.Resolve(acc); !errors.Is(err, api.ErrBadRequest) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("resolving %+v: %v, want %q", tc.m, err, tc.want)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, seed := range []string{
		`{"name":"wf1","stages":[2,6,6,8]}`,
		`{"name":"wf1","stages":[2,[3,1],8],"priority":-4,"share":[{"user":"bob","weight":1},{"user":"group:ml","weight":2}],"wait":true}`,
		`{"name":"a","stages":[[]]}`,
		`{"name":"a.b_c-1","stages":[1e3]}`,
		`{"name":"x","stages":[null]}`,
		`{"stages":[1],"name":"x","share":[{"user":"group:"}]}`,
		`[]`,
		``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		s, err := Decode(strings.NewReader(string(body)))
		if err != nil {
			if !errors.Is(err, api.ErrBadRequest) {
				t.Fatalf("error not a bad request: %v", err)
			}
			return
		}
		if CheckName(s.Name) != nil || len(s.Needs) == 0 || len(s.Needs) > MaxStages {
			t.Fatalf("accepted %+v", s)
		}
		for _, n := range s.Needs {
			if n < 1 {
				t.Fatalf("accepted a stage of %d", n)
			}
		}
		for _, m := range s.Share {
			if m.Weight < 0 || (m.Weight > 0) != Weighted(s.Share) {
				t.Fatalf("accepted share %+v", s.Share)
			}
		}
	})
}
