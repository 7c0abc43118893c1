package placement

import (
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
