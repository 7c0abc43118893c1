// Package placement is gpulet's placement engine: given an immutable view of the
// node and a request, it says where the request would go (a GPU, an MPS
// instance, unit indices) or why it cannot go anywhere, and whether it could fit
// later or never can on this node. It is pure: no locks, no I/O, no clock. The
// lease manager asks it and then commits; a dry run or a kubelet's preferred
// allocation asks it and commits nothing.
//
// A decision is a pipeline: node filters (draining), GPU filters (the GPU asked
// for, type, memory, compute capability, the GPU's state and utilization),
// instance filters (up, capacity, one user per MPS server), then the policy
// orders what is left. Each method of docs/design.md §1 is one filter or one
// policy.
//
// gpuletd, the collector and the replay share it, so it owns the types it
// decides by (Pool, Weights) and imports no config parser: the config package
// maps the file onto them.
package placement

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/errdefs"
)

// Node is what a decision looks at. Nothing in it is modified by the engine;
// the caller must not modify it while a decision runs.
type Node struct {
	// Draining is set while an admin has stopped new leases.
	Draining bool
	// OneUserPerInstance keeps users apart on MPS: an MPS server runs as one
	// user, and another user's clients would queue behind it.
	OneUserPerInstance bool
	// ClientsPerInstance is N: the most clients one instance admits.
	ClientsPerInstance int
	GPUs               []GPU
	// Host is the host's CPU and memory, for a decision that must respect
	// them (a cluster placement); nil: not looked at.
	Host *Host
}

// GPU is one GPU as placement sees it.
type GPU struct {
	Index          int
	UUID, Name     string
	MemoryTotalMiB uint64
	MemoryFreeMiB  uint64
	// Unusable says why the GPU takes no new leases now (failed, too busy);
	// empty when it may.
	Unusable string
	// Free is the GPU's free units, over all its instances; Units all its
	// units, free or not (U).
	Free      int
	Units     int
	Card      Card
	Instances []Instance
	// NUMANode is the GPU's NUMA node, for whole-GPU requests: N GPUs of
	// one NUMA node come first. GPUs whose topology is unknown all read 0,
	// as GPUs of one NUMA node would.
	NUMANode int
}

// Instance is one MPS instance of a GPU.
type Instance struct {
	Index int
	// Down says why the instance takes no new leases (its MPS control daemon
	// is down); empty when it may.
	Down string
	// FreeUnits are the instance's free unit indices, ascending.
	FreeUnits []int
	// Size is how many units the instance owns, free or not.
	Size    int
	Clients int
	// Users are the uids the instance serves now (leases, offline claims, its
	// MPS server), each once.
	Users []uint32
	// Holds are the units each user holds on it through leases and offline
	// claims: a user's holds keep others off only as many instances as
	// their units fill (binding.go).
	Holds []Hold
}

// Request is what is asked, with the caller's identity.
type Request struct {
	// Units is the units of one GPU a fractional request asks; GPUs the
	// whole GPUs a whole-GPU request asks (Units is then not looked at).
	// A request with neither asks no GPU: only the host decides.
	Units int
	GPUs  int
	// HostCPUMilli and HostMemoryMiB are what the request asks of the
	// host, checked when the node has a Host.
	HostCPUMilli, HostMemoryMiB uint64
	// GPU is a GPU index or UUID; empty: any.
	GPU string
	// Type is a case-insensitive part of the GPU's name; empty: any.
	Type      string
	MemoryMiB uint64
	// MinCC is the lowest compute capability accepted; zero: any.
	MinCC api.ComputeCapability
	UID   uint32
	// GIDs are the caller's groups (primary and supplementary), for pool
	// permissions; Admin callers may use every pool.
	GIDs  []uint32
	Admin bool
	// Pool is the pool the request names; empty: any pool the caller may use.
	Pool string
	// Prefer lists GPU model names, best first: the task's fastest models
	// (task–engine affinity). A GPU of a model nearer the front wins over
	// any policy; models not listed come last. Empty: no preference.
	Prefer []string
}

// Choice is where a request goes. A whole-GPU choice names its GPUs, in
// order, in GPUs (GPU is the first) and takes every unit of each; a choice
// for a request that asks no GPU has GPU and Instance -1.
type Choice struct {
	GPU, Instance int
	Units         []int
	GPUs          []int
}

// Verdict says why one GPU was kept or left out of a decision.
type Verdict struct {
	GPU  int
	Kept bool
	// Why says what left it out, or, when kept, is empty.
	Why string
	// Score is a kept GPU's score under the score policy; nil otherwise.
	Score *GPUScore
}

// Decision is the engine's answer: the choice, and per GPU why it was kept or
// left out (for a dry run and for error messages).
type Decision struct {
	Choice   Choice
	Policy   Policy
	Verdicts []Verdict
	// Best is the chosen candidate's figures, so that a cluster placement
	// can weigh the choices of several nodes as the policy weighs GPUs.
	Best Candidate
}

// ErrNeverFits marks a refusal that no change of the node's load could lift:
// no GPU of that type, more memory than any GPU has. It comes wrapped together
// with errdefs.ErrNoCapacity, so that the API answers 409 while a waiting
// request knows not to wait.
var ErrNeverFits = errors.New(api.NeverFits)

// Engine decides with one policy. It holds no state of the node and may be
// swapped whole (a config reload) while decisions run.
type Engine struct {
	policy  Policy
	weights Weights
	pools   pools
	// mix is the recent request mix the frag policy weighs over.
	mix *Mix
}

// New makes an engine with policy p and the default score weights.
func New(p Policy) *Engine { return &Engine{policy: p, weights: DefaultWeights} }

// Policy is the engine's policy.
func (e *Engine) Policy() Policy { return e.policy }

// Place decides where r goes on n. The error wraps errdefs.ErrUnavailable (the node
// is draining), errdefs.ErrInvalid (no such GPU), or errdefs.ErrNoCapacity,
// and then also ErrNeverFits when nothing on this node could ever take r. The
// decision's Verdicts are filled only when it fails; Explain fills them always.
func (e *Engine) Place(n *Node, r Request) (Decision, error) {
	return e.decide(n, r, decideOpts{units: true})
}

// Explain is Place with a verdict for every GPU considered, for a dry run.
func (e *Engine) Explain(n *Node, r Request) (Decision, error) {
	return e.decide(n, r, decideOpts{explain: true, units: true})
}

// Rank is Place without the chosen units (a fractional request's
// Choice.Units is nil), with the frag policy's view of n before the request
// kept in memo (nil: none kept) for the next decision on the same n: what a
// cluster asks of every node it ranks, where copying a GPU's worth of unit
// indices for each node not chosen, and weighing the node's state against
// the whole mix again, cost more than the decision. memo must be reset
// (Memo.Reset) when n changes or another engine decides.
func (e *Engine) Rank(n *Node, r Request, memo *Memo) (Decision, error) {
	return e.decide(n, r, decideOpts{memo: memo})
}

// decideOpts says what a decision makes beyond its choice.
type decideOpts struct {
	// explain fills a verdict for every GPU; units lists the chosen units.
	explain, units bool
	memo           *Memo
}

func (e *Engine) decide(n *Node, r Request, o decideOpts) (Decision, error) {
	explain := o.explain
	d := Decision{Policy: e.policy}
	if n.Draining {
		return d, errdefs.Errorf(errdefs.ErrUnavailable, "the node is draining: no new leases")
	}
	want, err := resolveGPU(n, r.GPU)
	if err != nil {
		return d, err
	}
	acc, err := e.accessFor(n, r)
	if err != nil {
		return d, err
	}
	if err := hostRefusal(n, r); err != nil {
		return d, err
	}
	switch {
	case r.GPUs > 0:
		return e.decideWhole(n, r, acc, o.memo)
	case r.Units <= 0:
		return e.hostOnly(n, r, o.memo), nil
	}
	best, found := Candidate{}, false
	less := e.policy.less()
	if acc != nil || len(r.Prefer) > 0 {
		less = preferring(less)
	}
	possible := false // some GPU could take r once its load allows
	bind := &binding{n: n}
	var verdicts []gpuVerdict
	if explain {
		verdicts = make([]gpuVerdict, 0, len(n.GPUs))
	}
	scoring := e.policy == Score
	var sc scorer
	if scoring {
		sc = newScorer(n, e.weights)
	}
	var fs *fragScorer
	if e.policy == Frag {
		fs = o.memo.fragScorer(n, e.mix)
	}
	for gi := range n.GPUs {
		g := &n.GPUs[gi]
		if want >= 0 && gi != want {
			continue
		}
		v := gpuVerdict{gpu: g.Index}
		why, poolFree := e.gpuAccess(acc, g)
		if why.kind == fits {
			why = never(g, r)
		}
		if v.why = why; v.why.kind != fits {
			if explain {
				verdicts = append(verdicts, v)
			}
			continue
		}
		possible = true
		if v.why = gpuNow(g, r); v.why.kind != fits {
			if explain {
				verdicts = append(verdicts, v)
			}
			continue
		}
		var score GPUScore
		if scoring {
			score = sc.score(g, r)
		}
		// The GPU's best instance, then the GPU against the best so far.
		bestK, bestFree := -1, 0
		for ki := range g.Instances {
			in := &g.Instances[ki]
			if why := instanceNow(n, bind, gi, ki, r); why.kind != fits {
				if explain {
					v.instances = append(v.instances, why)
				}
				continue
			}
			if f := len(in.FreeUnits); bestK < 0 || e.policy.instanceBefore(f, bestFree) {
				bestK, bestFree = ki, f
			}
		}
		if bestK >= 0 {
			v.kept = true
			c := Candidate{GPU: gi, Instance: bestK, Free: bestFree, GPUFree: g.Free, Score: score.rank(), PoolFree: poolFree, Rank: modelRank(r.Prefer, g.Name)}
			if fs != nil {
				c.Frag = roundScore(fs.delta(r, gi, r.Units))
			}
			if !found || less(c, best) {
				best, found = c, true
			}
		}
		if explain {
			if v.kept && scoring {
				// A copy: taking score's own address would move it to the
				// heap on every decision, explained or not.
				kept := score
				v.score = &kept
			}
			verdicts = append(verdicts, v)
		}
	}
	if !found && !explain {
		// The slow path: go again, keeping every reason for the message.
		o.explain = true
		return e.decide(n, r, o)
	}
	if explain {
		d.Verdicts = make([]Verdict, len(verdicts))
		for i, v := range verdicts {
			d.Verdicts[i] = v.verdict()
		}
	}
	if !found {
		return d, refusal(n, r, d.Verdicts, possible)
	}
	in := &n.GPUs[best.GPU].Instances[best.Instance]
	d.Choice = Choice{GPU: n.GPUs[best.GPU].Index, Instance: in.Index}
	if o.units {
		d.Choice.Units = append([]int(nil), in.FreeUnits[:r.Units]...)
	}
	d.Best = best
	if fs != nil {
		d.Best.Align = HostAlign(n, r)
	}
	return d, nil
}

// gpuVerdict is a Verdict before it is put in words.
type gpuVerdict struct {
	gpu       int
	kept      bool
	why       reason
	instances []reason
	score     *GPUScore
}

func (v gpuVerdict) verdict() Verdict {
	out := Verdict{GPU: v.gpu, Kept: v.kept, Score: v.score}
	if v.kept {
		return out
	}
	if v.why.kind != fits {
		out.Why = v.why.String()
		return out
	}
	whys := make([]string, len(v.instances))
	for i, r := range v.instances {
		whys[i] = r.String()
	}
	out.Why = strings.Join(whys, "; ")
	return out
}

// refusal explains why no instance could take r: what kept each GPU out
// first, then what is free on the node.
func refusal(n *Node, r Request, verdicts []Verdict, possible bool) error {
	free := 0
	for _, g := range n.GPUs {
		free += g.Free
	}
	whys := make([]string, len(verdicts))
	for i, v := range verdicts {
		whys[i] = fmt.Sprintf("GPU %d %s", v.GPU, v.Why)
	}
	detail := strings.Join(whys, "; ")
	if !possible {
		return &neverFits{errdefs.Errorf(errdefs.ErrNoCapacity, "%s: %d unit(s)%s: %s", ErrNeverFits, r.Units, describe(r), detail)}
	}
	return errdefs.Errorf(errdefs.ErrNoCapacity, "no GPU can take %d unit(s)%s now: %s (%d free on the node)", r.Units, describe(r), detail, free)
}

// neverFits is an insufficient_units error that also matches ErrNeverFits.
type neverFits struct{ error }

func (e *neverFits) Is(target error) bool { return target == ErrNeverFits }
func (e *neverFits) Unwrap() error        { return e.error }

// describe names the request's filters for a message.
func describe(r Request) string {
	var parts []string
	if r.GPU != "" {
		parts = append(parts, "on GPU "+r.GPU)
	}
	if r.Type != "" {
		parts = append(parts, fmt.Sprintf("of type %q", r.Type))
	}
	if r.MemoryMiB > 0 {
		parts = append(parts, fmt.Sprintf("with %d MiB", r.MemoryMiB))
	}
	if !r.MinCC.IsZero() {
		parts = append(parts, fmt.Sprintf("of compute capability %s or above", r.MinCC))
	}
	if r.Pool != "" {
		parts = append(parts, "in pool "+r.Pool)
	}
	if len(parts) == 0 {
		return ""
	}
	return " " + strings.Join(parts, " ")
}
