package placement

import (
	"cmp"
	"maps"
	"slices"
	"sync"
)

// Learner learns the recent request mix from the requests placed, for the
// frag policy. It is the only state the policy has, and it stays outside the
// engine: the caller observes each request it placed and hands the engine
// the Mix it publishes (Engine.WithMix), so a decision stays pure. Safe for
// concurrent use.
//
// The requests of a named user (ObserveBy) are bounded, so that no one user
// steers the mix others are placed under: a user's remembered requests weigh
// at most UserShare of the window (their own oldest fade as new ones come,
// and they age nobody else's), and at most UserShare of a mix published, or
// an equal share when fewer users than 1/UserShare are remembered.
type Learner struct {
	mu sync.Mutex // guards everything below
	// counts weighs each shape seen, by whose requests they were ("" for
	// Observe's, the requests of no one in particular); older requests
	// weigh less, all halved each time the total passes window.
	counts map[string]map[Shape]float64
	// weights is each user's requests' weight, the sum of its counts.
	weights map[string]float64
	total   float64
	window  float64
	keep    int
	every   int
	since   int
	mix     *Mix
}

// UserShare bounds a named user's part of a learner's window and of a mix
// published (Learner). A quarter: four users or more are weighed by their
// requests, as long as none asks more than a quarter of them; one user
// flooding a node with requests is a quarter of its mix, and an eighth, or
// less, of the requests a node of 1,024 remembers fades to make room for it.
const UserShare = 0.25

// NewLearner makes a learner that remembers about window requests (older
// ones fade by halves), keeps the keep most frequent shapes in its mix, and
// publishes a new mix every every requests observed (a decision costs as
// many passes over a node's GPUs as the mix has shapes).
func NewLearner(window, keep, every int) *Learner {
	return &Learner{counts: map[string]map[Shape]float64{}, weights: map[string]float64{},
		window: float64(max(window, 1)), keep: max(keep, 1), every: max(every, 1)}
}

// ShapeOf is the shape of r as a mix counts it.
func ShapeOf(r Request) Shape {
	s := Shape{Units: r.Units, GPUs: r.GPUs, Type: r.Type, HostCPUMilli: r.HostCPUMilli, HostMemoryMiB: r.HostMemoryMiB}
	if s.GPUs > 0 {
		s.Units = 0
	}
	return s
}

// Observe counts one request of no one in particular, unbounded: a trace
// replayed, whose pods are the workload measured. A request of no GPU is
// not counted: no choice changes what of the GPU it could use (none), so,
// as in FGD, it would steer no decision, only take a place among the
// shapes kept; counted as the shape of a host's CPU and memory, it made
// the policy keep CPU free for requests that use no GPU.
func (l *Learner) Observe(r Request) { l.observe("", ShapeOf(r)) }

// ObserveBy counts one request of user (a name that is not empty), within
// the user's bound (UserShare): past it, the user's older requests weigh
// less, so that theirs weigh UserShare of the window with this one.
func (l *Learner) ObserveBy(user string, r Request) {
	if user == "" {
		panic("placement: ObserveBy with no user; Observe counts the requests of no one")
	}
	l.observe(user, ShapeOf(r))
}

// ObserveShape counts one request by its shape s, ShapeOf's with what the
// caller knows more of the request (a cluster's: the GPU models it
// accepts); as ObserveBy's for a user, as Observe's for none ("").
func (l *Learner) ObserveShape(user string, s Shape) { l.observe(user, s) }

func (l *Learner) observe(user string, s Shape) {
	if s.Units == 0 && s.GPUs == 0 {
		return
	}
	s.Weight = 0
	l.mu.Lock()
	defer l.mu.Unlock()
	if user != "" {
		l.makeRoomLocked(user)
	}
	c := l.counts[user]
	if c == nil {
		c = map[Shape]float64{}
		l.counts[user] = c
	}
	c[s]++
	l.weights[user]++
	l.total++
	if l.total > l.window {
		l.halveLocked()
	}
	if l.since++; l.since >= l.every || l.mix == nil {
		l.since = 0
		l.mix = l.publishLocked()
	}
}

// makeRoomLocked scales down user's counts, when one more request would
// take them past UserShare of the window, so that with it they weigh that
// much: the user's older requests fade for the new one, no one else's.
func (l *Learner) makeRoomLocked(user string) {
	room := UserShare * l.window
	w := l.weights[user]
	if w+1 <= room {
		return
	}
	f := max(room-1, 0) / w
	c := l.counts[user]
	for s, n := range c {
		if n *= f; n < 0.5 {
			delete(c, s)
			continue
		}
		c[s] = n
	}
	l.weights[user] = sumOf(c)
	l.total = l.sumWeightsLocked()
}

// halveLocked halves every count, forgetting those under a half, once the
// total passed the window.
func (l *Learner) halveLocked() {
	for user, c := range l.counts {
		for s, n := range c {
			if n /= 2; n < 0.5 {
				delete(c, s)
				continue
			}
			c[s] = n
		}
		if len(c) == 0 {
			delete(l.counts, user)
			delete(l.weights, user)
			continue
		}
		l.weights[user] = sumOf(c)
	}
	l.total = l.sumWeightsLocked()
}

// sumOf sums c in the shapes' order, not the map's: float addition is not
// associative, and the same requests must give the same mix (a replay, run
// again, places as it did).
func sumOf(c map[Shape]float64) float64 {
	shapes := slices.SortedFunc(maps.Keys(c), byFields)
	var sum float64
	for _, s := range shapes {
		sum += c[s]
	}
	return sum
}

// sumWeightsLocked sums the users' weights in the users' order.
func (l *Learner) sumWeightsLocked() float64 {
	var sum float64
	for _, user := range slices.Sorted(maps.Keys(l.weights)) {
		sum += l.weights[user]
	}
	return sum
}

// Mix is the mix as last published: nil before any request of GPU was
// observed.
func (l *Learner) Mix() *Mix {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mix
}

// publishLocked makes a mix of the keep most frequent shapes, each weighed
// by its share of all the requests remembered, each user's requests
// weighing at most their bound (userScales).
func (l *Learner) publishLocked() *Mix {
	var shapes []Shape
	if len(l.counts) == 1 {
		// One user's requests (or no one's) are all the mix: weighed as
		// they are.
		for _, c := range l.counts {
			for s, n := range c {
				s.Weight = n / l.total
				shapes = append(shapes, s)
			}
		}
	} else {
		users := slices.Sorted(maps.Keys(l.counts))
		scale := userScales(users, l.weights)
		weight := map[Shape]float64{}
		var total float64
		for _, user := range users {
			for _, s := range slices.SortedFunc(maps.Keys(l.counts[user]), byFields) {
				weight[s] += scale[user] * l.counts[user][s]
			}
			total += scale[user] * l.weights[user]
		}
		for s, w := range weight {
			s.Weight = w / total
			shapes = append(shapes, s)
		}
	}
	// Ties by the shape's fields, so that a mix does not depend on the
	// map's order.
	slices.SortFunc(shapes, func(a, b Shape) int {
		return cmp.Or(cmp.Compare(b.Weight, a.Weight), byFields(a, b))
	})
	if len(shapes) > l.keep {
		shapes = append(shapes[:l.keep:l.keep], restrictedClasses(shapes[l.keep:])...)
	}
	return &Mix{Shapes: shapes}
}

// RestrictedClasses is how many classes of the shapes restricted to some
// GPU models a mix keeps beside its most frequent shapes
// (restrictedClasses).
const RestrictedClasses = 16

// restrictedClasses merges the shapes left out of a mix (rest, the most
// frequent first) that accept only some GPU models into classes of the
// same GPU part (units or GPUs, type and models), each asking the least
// CPU and memory of its shapes and weighing their sum, and keeps the
// RestrictedClasses heaviest. A shape is a request's GPU part with its
// host part, so the requests that accept only one model come in many
// shapes, each rare, of which few are among the most frequent: without
// them the mix saw no demand for the model, and the policy gave its GPUs
// to requests that could have gone anywhere, until the requests that
// could go nowhere else failed (docs/replay.md, gpuspec20). The requests
// that accept any model are left out: their demand is in the mix's
// shapes already, and classes of them, weighed in, kept whole GPUs from
// requests of part of one for requests of several that were rare
// (measured lower on the openb lists).
func restrictedClasses(rest []Shape) []Shape {
	at := map[Shape]int{}
	var out []Shape
	for _, s := range rest {
		if !s.Restricted() {
			continue
		}
		class := Shape{Units: s.Units, GPUs: s.GPUs, Type: s.Type, Models: s.Models}
		i, ok := at[class]
		if !ok {
			at[class] = len(out)
			out = append(out, s)
			continue
		}
		c := &out[i]
		c.Weight += s.Weight
		c.HostCPUMilli = min(c.HostCPUMilli, s.HostCPUMilli)
		c.HostMemoryMiB = min(c.HostMemoryMiB, s.HostMemoryMiB)
	}
	slices.SortStableFunc(out, func(a, b Shape) int { return cmp.Compare(b.Weight, a.Weight) })
	return out[:min(len(out), RestrictedClasses)]
}

// userScales is what each user's weight is multiplied by in a mix: 1, or
// less for a user whose requests would make more than their share of it,
// UserShare or, among fewer users than 1/UserShare, an equal share. The
// users over the bound are brought down to one weight, the largest that
// keeps each of them within it (water-filling).
func userScales(users []string, weights map[string]float64) map[string]float64 {
	w := make([]float64, len(users))
	for i, user := range users {
		w[i] = weights[user]
	}
	slices.Sort(w)
	n := len(w)
	share := max(UserShare, 1/float64(n))
	var sum float64
	for _, x := range w {
		sum += x
	}
	limit := w[n-1] // no one over the bound: every weight as it is
	if w[n-1] > share*sum {
		limit = w[0] // every user over it: equal shares
		rest := sum
		// The m heaviest brought down to limit, the others as they are:
		// limit = share × (rest + m × limit).
		for m := 1; m < n; m++ {
			rest -= w[n-m]
			if d := 1 - share*float64(m); d > 0 {
				if c := share * rest / d; c >= w[n-m-1] {
					limit = c
					break
				}
			}
		}
	}
	scale := make(map[string]float64, n)
	for _, user := range users {
		scale[user] = min(1, limit/weights[user])
	}
	return scale
}

// byFields orders shapes by their fields, but for Weight.
func byFields(a, b Shape) int {
	return cmp.Or(cmp.Compare(a.GPUs, b.GPUs), cmp.Compare(a.Units, b.Units),
		cmp.Compare(a.HostCPUMilli, b.HostCPUMilli), cmp.Compare(a.HostMemoryMiB, b.HostMemoryMiB), cmp.Compare(a.Type, b.Type), cmp.Compare(a.Models, b.Models))
}
