package placement

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
)

// TestLearnerIsDeterministic: the same requests, observed again, give the
// same mix to the last bit, whatever order the learner's map is walked in
// when older requests fade.
func TestLearnerIsDeterministic(t *testing.T) {
	learn := func() *Mix {
		rng := rand.New(rand.NewPCG(1, 2))
		l := NewLearner(64, 16, 1)
		for range 20000 {
			l.Observe(Request{Units: 1 + rng.IntN(12)})
		}
		return l.Mix()
	}
	first := learn()
	for i := range 20 {
		if m := learn(); !reflect.DeepEqual(m, first) {
			t.Fatalf("run %d: %v, first run %v", i+1, m.Shapes, first.Shapes)
		}
	}
}

// weightOf is the weight of the shape of r in m, 0 when m has none.
func weightOf(m *Mix, r Request) float64 {
	want := ShapeOf(r)
	for _, s := range m.Shapes {
		if w := s.Weight; byFields(s, want) == 0 {
			return w
		}
	}
	return 0
}

// TestLearnerBoundsAUsersShare: one user's flood of requests (ten windows'
// worth) makes at most UserShare of the mix, beside four users of a few
// requests each; with one other user, half.
func TestLearnerBoundsAUsersShare(t *testing.T) {
	flood := Request{Units: 12}
	for _, tc := range []struct {
		name   string
		others int
		bound  float64
	}{
		{"four others", 4, UserShare},
		{"one other", 1, 0.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLearner(1024, 16, 1)
			for i := range tc.others {
				for range 3 {
					l.ObserveBy(fmt.Sprint("user", i), Request{Units: 1 + i})
				}
			}
			for range 10000 {
				l.ObserveBy("flooder", flood)
			}
			m := l.Mix()
			if w := weightOf(m, flood); w > tc.bound+1e-9 || w < tc.bound-1e-9 {
				t.Fatalf("the flood weighs %v of the mix %v, want %v", w, m.Shapes, tc.bound)
			}
			// The others' few requests are all still remembered: the
			// flood aged none of them.
			for i := range tc.others {
				if weightOf(m, Request{Units: 1 + i}) == 0 {
					t.Fatalf("user%d's requests left the mix %v", i, m.Shapes)
				}
			}
		})
	}
}

// TestLearnerFollowsOneUser: a user alone on a node, past their bound of
// the window, still moves the mix: their older requests fade for new ones.
func TestLearnerFollowsOneUser(t *testing.T) {
	l := NewLearner(1024, 16, 1)
	for range 5000 {
		l.ObserveBy("a", Request{Units: 2})
	}
	if w := weightOf(l.Mix(), Request{Units: 2}); w != 1 {
		t.Fatalf("one user's one shape weighs %v, want 1", w)
	}
	for range 5000 {
		l.ObserveBy("a", Request{Units: 4})
	}
	m := l.Mix()
	if w := weightOf(m, Request{Units: 4}); w < 0.99 {
		t.Fatalf("after 5,000 requests of 4 units the mix is %v, want the 4s alone", m.Shapes)
	}
}

// TestLearnerWeighsUsersByRequestsWithinTheBound: users within their share
// are weighed by their requests, as requests of no one are.
func TestLearnerWeighsUsersByRequestsWithinTheBound(t *testing.T) {
	l := NewLearner(1024, 16, 1)
	for i, n := range []int{20, 20, 20, 20, 10} {
		for range n {
			l.ObserveBy(fmt.Sprint("user", i), Request{Units: 1 + i})
		}
	}
	if w := weightOf(l.Mix(), Request{Units: 5}); w != 10.0/90 {
		t.Fatalf("10 requests of 90 weigh %v", w)
	}
}

// TestLearnerWithUsersIsDeterministic: as TestLearnerIsDeterministic, with
// users past their bound and fading.
func TestLearnerWithUsersIsDeterministic(t *testing.T) {
	learn := func() *Mix {
		rng := rand.New(rand.NewPCG(3, 4))
		l := NewLearner(64, 16, 1)
		for range 4000 {
			l.ObserveBy(fmt.Sprint("user", rng.IntN(6)), Request{Units: 1 + rng.IntN(12)})
		}
		return l.Mix()
	}
	first := learn()
	for i := range 10 {
		if m := learn(); !reflect.DeepEqual(m, first) {
			t.Fatalf("run %d: %v, first run %v", i+1, m.Shapes, first.Shapes)
		}
	}
}
