// Package cluster places a request over many nodes: given each node's model
// (the placement engine's view of it, with its host's CPU and memory), it
// asks the node's own placement engine (placement), the same that
// gpuletd decides with, for each node that could take the request, and
// ranks their answers by the policy. It is the collector's placement code
// and the replay's (cmd/gpulet-replay): it keeps its nodes in memory, starts
// no process and opens no socket. A cluster is not safe for concurrent use.
//
// It does not decide where a request goes twice: a node's answer is the
// engine's; the cluster only leaves out the nodes that cannot fit the
// request without asking their engine, orders the answers, and, when asked
// to commit, changes the chosen node's model as a lease would.
package cluster

import (
	"fmt"
	"slices"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/errdefs"
	"github.com/gpulet/gpulet/placement"
)

// Request is a request to the cluster: the engine's request, and the GPU
// models it accepts (any of them; empty: any model), as a pod's GPU
// specification lists them.
type Request struct {
	placement.Request
	Models []string
	// accepts is, per GPU model met, whether Models accepts it: Place
	// reads each node's models, and comparing names is case-insensitive,
	// which allocates.
	accepts map[string]bool
}

// Verdict is one node's answer.
type Verdict struct {
	Node string
	// Kept says the node could take the request; Why says why not.
	Kept bool
	Why  string
	// Choice and Best are the engine's choice on the node and its figures.
	Choice placement.Choice
	Best   placement.Candidate
	// FreeUnits is the node's free units before the request, which breaks
	// ties between nodes: the fuller first, as best-fit keeps large holes.
	FreeUnits int
	index     int
}

// Answer is where a request goes: the best node first, then the next best,
// up to the limit asked. Considered counts the nodes whose engine was asked;
// the others could not fit the request on their summary alone.
type Answer struct {
	Ranked     []Verdict
	Considered int
	Nodes      int
}

// Cluster is a set of node models and the engine that decides on each.
type Cluster struct {
	engine *placement.Engine
	policy placement.Policy
	nodes  []*node
	byName map[string]int
	// scratch and floorScratch are placeBounded's and placeFloored's
	// lists of nodes to ask, kept between placements.
	scratch      []boundCand
	floorScratch floorHeap
	// tables: frag's shape tables; placements: the reads of them (shapetable.go).
	tables     []*shapeTable
	placements uint64
}

type node struct {
	name  string
	model *placement.Node
	sum   summary
	// cache holds the engine's answers to requests while the model stays
	// as it is, and memo what the engine learnt of the model: a change of
	// the model drops both.
	cache map[cacheKey]cached
	memo  placement.Memo
}

// changed drops what was kept of n's model, which changed.
func (n *node) changed() {
	n.cache = nil
	n.memo.Reset()
}

// summary is what decides, without the engine, that a node cannot fit a
// request: the largest free part of one GPU, the whole GPUs, the host's
// free CPU and memory, and its GPU models.
type summary struct {
	maxFree, whole, free int
	cpuFree, memFree     uint64
	models               []string
	// frees are the usable GPUs' free units, and minUnits and maxUnits
	// the fewest and most units of a GPU, for bound.
	frees              []int
	minUnits, maxUnits int
}

// New makes an empty cluster whose nodes decide with e.
func New(e *placement.Engine) *Cluster {
	return &Cluster{engine: e, policy: e.Policy(), byName: map[string]int{}}
}

// Add adds an empty node of spec s.
func (c *Cluster) Add(s NodeSpec) error {
	if _, dup := c.byName[s.Name]; dup {
		return fmt.Errorf("node %s: added twice", s.Name)
	}
	m, err := newNode(s)
	if err != nil {
		return err
	}
	n := &node{name: s.Name, model: m}
	n.summarize()
	c.byName[s.Name] = len(c.nodes)
	c.staleRows(len(c.nodes))
	c.nodes = append(c.nodes, n)
	return nil
}

// Len is the number of nodes.
func (c *Cluster) Len() int { return len(c.nodes) }

func (n *node) summarize() {
	s := summary{models: n.sum.models[:0], frees: n.sum.frees[:0]}
	for gi := range n.model.GPUs {
		g := &n.model.GPUs[gi]
		if gi == 0 || g.Units < s.minUnits {
			s.minUnits = g.Units
		}
		s.maxUnits = max(s.maxUnits, g.Units)
		if !slices.Contains(s.models, g.Name) {
			s.models = append(s.models, g.Name)
		}
		if g.Unusable != "" {
			continue
		}
		s.free += g.Free
		s.frees = append(s.frees, g.Free)
		s.maxFree = max(s.maxFree, g.Free)
		if g.Free == g.Units {
			s.whole++
		}
	}
	if h := n.model.Host; h != nil {
		s.cpuFree, s.memFree = h.CPUMilliFree, h.MemoryMiBFree
	}
	n.sum = s
}

// mayFit says whether a node of summary s could take r now; false is
// certain, true is for the engine to decide.
func (s *summary) mayFit(r *Request) bool { return s.fitsResources(r) && s.fitsModels(r) }

// fitsResources is mayFit but for the models r accepts.
func (s *summary) fitsResources(r *Request) bool {
	switch {
	case r.HostCPUMilli > s.cpuFree || r.HostMemoryMiB > s.memFree:
		return false
	case r.GPUs > 0 && s.whole < r.GPUs:
		return false
	case r.GPUs == 0 && r.Units > s.maxFree:
		return false
	}
	return true
}

// cacheKey is what of a request an engine's answer depends on, for the
// requests a replay or a collector sees again and again.
type cacheKey struct {
	units, gpus         int
	cpu, mem, memoryMiB uint64
	// hostPart stands for cpu and mem where the engine says what of them
	// its answer depends on (placement.Engine.HostPart).
	hostPart uint64
	typ      string
	minCC    api.ComputeCapability
}

// cached is an engine's answer as a node keeps it: the choice without its
// units (up to a GPU's worth of ints for each request kept, on every node),
// which the answers that win are asked again for (complete).
type cached struct {
	kept   bool
	choice placement.Choice
	best   placement.Candidate
}

// cacheable says whether r's answer depends only on its cacheKey: no
// identity, pool, GPU, model list or task of its own.
func cacheable(r *Request) bool {
	return r.GPU == "" && r.Pool == "" && len(r.Prefer) == 0 && len(r.Models) == 0 && r.UID == 0 && len(r.GIDs) == 0 && !r.Admin
}

// ask is the node's engine's answer to r.
func (c *Cluster) ask(n *node, r *Request) cached {
	var key cacheKey
	useCache := cacheable(r)
	if useCache {
		key = cacheKey{units: r.Units, gpus: r.GPUs, cpu: r.HostCPUMilli, mem: r.HostMemoryMiB, memoryMiB: r.MemoryMiB, typ: r.Type, minCC: r.MinCC}
		// Only the frag policy's figures depend on the host's part of a
		// request, and only through what the engine's HostPart says; a
		// host that cannot give it is left out before the engine is
		// asked (summary.mayFit).
		if part, ok := c.engine.HostPart(n.model, r.Request); ok {
			key.cpu, key.mem, key.hostPart = 0, 0, part
		}
		if v, ok := n.cache[key]; ok {
			if c.policy == placement.Frag && n.model.Host != nil {
				v.best.Align = placement.HostAlign(n.model, r.Request)
			}
			return v
		}
	}
	d, err := c.decide(n, r, false)
	v := cached{kept: err == nil, choice: d.Choice, best: d.Best}
	if useCache {
		if n.cache == nil {
			n.cache = map[cacheKey]cached{}
		}
		n.cache[key] = v
	}
	return v
}

// decide is the engine's decision on n for r, the chosen units listed when
// units is true: only the answers that win are asked for them again.
func (c *Cluster) decide(n *node, r *Request, units bool) (placement.Decision, error) {
	d, err := c.engineDecide(n, r.Request, units)
	if err == nil && len(r.Models) > 0 && r.GPUs+r.Units > 0 && !modelsAccept(r.Models, n.model, d.Choice) {
		// The node has a model asked and one not asked: ask again for
		// each model asked, and keep the best.
		d, err = c.placeByModel(n, r, units)
	}
	return d, err
}

func (c *Cluster) engineDecide(n *node, r placement.Request, units bool) (placement.Decision, error) {
	if units {
		return c.engine.Place(n.model, r)
	}
	return c.engine.Rank(n.model, r, &n.memo)
}

// complete gives the ranked answers their units, which kept answers lack.
func (c *Cluster) complete(r *Request, ranked []Verdict) error {
	for i := range ranked {
		v := &ranked[i]
		if v.Choice.Units != nil || r.Units <= 0 || r.GPUs > 0 {
			continue
		}
		d, err := c.decide(c.nodes[v.index], r, true)
		if err != nil {
			return fmt.Errorf("node %s: its engine refused what it had answered: %w", v.Node, err)
		}
		v.Choice = d.Choice
	}
	return nil
}

// Place ranks the nodes that can take r now, best first, and returns up to
// limit of them (at least one). It fails with errdefs.ErrNoCapacity when
// no node can.
func (c *Cluster) Place(r Request, limit int) (Answer, error) {
	limit = max(limit, 1)
	a := Answer{Nodes: len(c.nodes)}
	var t *shapeTable
	if c.bounded() || c.policy == placement.Frag {
		t = c.shapeTable(&r)
	}
	switch {
	case t != nil:
		c.placeTabled(t, &r, limit, &a)
	case c.bounded():
		c.placeBounded(&r, limit, &a)
	case c.policy == placement.Frag:
		c.placeFloored(&r, limit, &a)
	default:
		c.placeAll(&r, limit, &a)
	}
	if len(a.Ranked) == 0 {
		return a, errdefs.Errorf(errdefs.ErrNoCapacity, "no node can take the request now (%d of %d nodes could fit it on their free resources; their engines refused)", a.Considered, len(c.nodes))
	}
	return a, c.complete(&r, a.Ranked)
}

// placeAll asks every node that may fit r.
func (c *Cluster) placeAll(r *Request, limit int, a *Answer) {
	for i, n := range c.nodes {
		if !n.sum.mayFit(r) {
			continue
		}
		a.Considered++
		v := c.ask(n, r)
		if !v.kept {
			continue
		}
		cand := Verdict{Node: n.name, Kept: true, Choice: v.choice, Best: v.best, FreeUnits: n.sum.free, index: i}
		a.Ranked = c.insert(a.Ranked, cand, limit)
		if c.policy == placement.FirstFit && len(a.Ranked) == limit {
			// Nodes come in order: no later one comes before these.
			break
		}
	}
}

// insert puts v among the best limit verdicts, kept in order.
func (c *Cluster) insert(ranked []Verdict, v Verdict, limit int) []Verdict {
	if len(ranked) == limit && !c.before(v, ranked[len(ranked)-1]) {
		return ranked
	}
	i := len(ranked)
	for i > 0 && c.before(v, ranked[i-1]) {
		i--
	}
	if len(ranked) < limit {
		ranked = append(ranked, Verdict{})
	}
	copy(ranked[i+1:], ranked[i:])
	ranked[i] = v
	return ranked
}

// before orders two nodes' answers under the policy, as the engine orders
// two GPUs of one node: the policy's figure of each node's choice first,
// then the fuller node, then the node added first.
func (c *Cluster) before(a, b Verdict) bool {
	x, y := a.Best, b.Best
	switch c.policy {
	case placement.FirstFit:
		return a.index < b.index
	case placement.Score:
		if x.Score != y.Score {
			return x.Score > y.Score
		}
	case placement.Frag:
		return c.keyOf(a).less(c.keyOf(b))
	case placement.Spread:
		if x.GPUFree != y.GPUFree {
			return x.GPUFree > y.GPUFree
		}
		if a.FreeUnits != b.FreeUnits {
			return a.FreeUnits > b.FreeUnits
		}
		return a.index < b.index
	}
	if x.GPUFree != y.GPUFree {
		return x.GPUFree < y.GPUFree
	}
	if a.FreeUnits != b.FreeUnits {
		return a.FreeUnits < b.FreeUnits
	}
	return a.index < b.index
}

// Commit applies v, an answer of Place to r, to its node's model, as the
// node's lease would.
func (c *Cluster) Commit(r Request, v Verdict) error {
	i, ok := c.byName[v.Node]
	if !ok {
		return fmt.Errorf("no node %q", v.Node)
	}
	n := c.nodes[i]
	commit(n.model, r.Request, v.Choice)
	n.changed()
	n.summarize()
	c.staleRows(i)
	return nil
}

// Fragmentation is the cluster's expected fragmentation under m: the sum
// of its nodes' (placement.Fragmentation), in units.
func (c *Cluster) Fragmentation(m *placement.Mix) float64 {
	out := 0.0
	for _, n := range c.nodes {
		out += placement.Fragmentation(n.model, m)
	}
	return out
}

// Totals are the cluster's units and free units, over its usable GPUs.
func (c *Cluster) Totals() (units, free int) {
	for _, n := range c.nodes {
		for gi := range n.model.GPUs {
			g := &n.model.GPUs[gi]
			units += g.Units
		}
		free += n.sum.free
	}
	return units, free
}

// Put sets node name's model to m, adding the node if the cluster lacks
// it: the collector's nodes are what their last snapshots say, not models
// the cluster changes itself. The cluster keeps m; the caller must not
// change it afterwards.
func (c *Cluster) Put(name string, m *placement.Node) {
	i, ok := c.byName[name]
	if !ok {
		i = len(c.nodes)
		c.byName[name] = i
		c.nodes = append(c.nodes, &node{name: name})
	}
	n := c.nodes[i]
	n.model = m
	n.changed()
	n.summarize()
	c.staleRows(i)
}

// Remove drops node name, if the cluster has it.
func (c *Cluster) Remove(name string) {
	i, ok := c.byName[name]
	if !ok {
		return
	}
	last := len(c.nodes) - 1
	// The last node's rows leave with its index, which it leaves.
	c.staleRows(last)
	c.nodes[i] = c.nodes[last]
	c.byName[c.nodes[i].name] = i
	c.nodes = c.nodes[:last]
	delete(c.byName, name)
	c.staleRows(i)
}

// Names lists the nodes, in the cluster's order.
func (c *Cluster) Names() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.name
	}
	return out
}
