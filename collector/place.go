package collector

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/collector/cluster"
	"github.com/gpulet/gpulet/placement"
)

// MaxPlacements bounds ?limit= of POST /v1/placements.
const MaxPlacements = 100

// PlacementRequest is the body of POST /v1/placements: what a node's dry run
// takes that the collector can judge from snapshots. A pool is a node's own
// config, which no snapshot carries, so it is refused.
type PlacementRequest struct {
	Units     int    `json:"units,omitempty"`
	GPUs      int    `json:"gpus,omitempty"`
	MemoryMiB uint64 `json:"memory_mib,omitempty"`
	Type      string `json:"type,omitempty"`
	MinCC     string `json:"min_cc,omitempty"`
	Pool      string `json:"pool,omitempty"`
}

// Placement is one node's answer: where the request would go there.
type Placement struct {
	Node string       `json:"node"`
	GPU  api.LeaseGPU `json:"gpu"`
	// GPUs are the whole GPUs of a request of "gpus"; absent otherwise.
	GPUs     []api.LeaseGPU `json:"gpus,omitempty"`
	Instance int            `json:"instance"`
	// FreeUnits is the node's free units before the request.
	FreeUnits int `json:"free_units"`
	// Score is the GPU's score under the score policy, 0 otherwise.
	Score float64 `json:"score"`
}

// PlacementList is the answer of POST /v1/placements: the best nodes first,
// how many nodes the engine was asked about (the others could not fit the
// request on their free resources alone), and how many the table has.
type PlacementList struct {
	Policy     string      `json:"policy"`
	Placements []Placement `json:"placements"`
	Considered int         `json:"considered"`
	Nodes      int         `json:"nodes"`
}

// placer keeps a placement model of every node of the table, made from its
// last snapshot, and asks the cluster placement (each node's own engine)
// where a request goes. Placements are advisory: the node decides at lease
// time.
type placer struct {
	mu      sync.Mutex // guards everything below; one placement at a time
	cluster *cluster.Cluster
	policy  placement.Policy
	// modeled is, per node, the record and state its model was made from.
	modeled map[string]modeledNode
	// synced is when every node's state was last looked at.
	synced time.Time
	// learner learns the request mix from the requests placed for the
	// callers of --learn-tokens-file, under every policy, so that GET
	// /v1/placements/mix shows what frag would weigh; observed counts
	// them. mix is the mix in force, under frag only.
	learner  *placement.Learner
	observed uint64
	mix      *placement.Mix
	// published is the learner's mix last looked at: a mix is compared
	// with the one in force once, when published (cluster.MixMoved).
	published *placement.Mix
	// asking bounds each client's requests under way and lets them
	// place one at a time, the clients in turn.
	asking askers
}

type modeledNode struct {
	rec   *record
	state string
}

func newPlacer(p placement.Policy) *placer {
	return &placer{cluster: cluster.New(placement.New(p)), policy: p, modeled: map[string]modeledNode{}, learner: cluster.NewLearner()}
}

// place waits for client's turn (askers; take counted the request),
// brings the models up to date with the table, places r and, once placed,
// learns it as caller's (not at all for no caller). Only the nodes
// whose record changed are put again, with the model made as the record
// was taken in, and, once every resync, all of them: a node that went
// silent changes state without a new record, and is modeled again.
func (p *placer) place(ctx context.Context, st *Store, r cluster.Request, limit int, caller, client string) (cluster.Answer, map[string]*record, error) {
	if err := p.asking.enter(ctx, client); err != nil {
		return cluster.Answer{}, nil, api.Errorf(api.ErrUnavailable, "placement request given up while waiting for its turn: %v", err)
	}
	defer p.asking.leave()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refreshLocked(st)
	a, err := p.cluster.Place(r, limit)
	recs := make(map[string]*record, len(a.Ranked))
	for _, v := range a.Ranked {
		recs[v.Node] = p.modeled[v.Node].rec
	}
	if err == nil && caller != "" {
		p.learnLocked(caller, r)
	}
	return a, recs, err
}

// learnLocked counts r, placed for caller, in the mix. Only a request
// placed is counted: one that no node fits, or could ever fit, would
// otherwise steer the mix at no cost. Nor is a request of no one
// named: where anyone may ask, anyone could steer.
func (p *placer) learnLocked(caller string, r cluster.Request) {
	p.learner.ObserveShape(caller, cluster.ShapeOf(r))
	p.observed++
	m := p.learner.Mix()
	if p.policy != placement.Frag || m == p.published {
		return
	}
	p.published = m
	if cluster.MixMoved(p.mix, m) {
		// SetEngine drops every node's kept answers and floors, which
		// were the old mix's.
		p.mix = m
		p.cluster.SetEngine(placement.New(placement.Frag).WithMix(m))
	}
}

// refreshLocked models again the nodes of st that changed since the last
// placement.
func (p *placer) refreshLocked(st *Store) {
	changed, all := st.takeChanged()
	now := st.now()
	if !all && now.Sub(p.synced) >= resync(st.staleAfter) {
		// Every node is looked at again for its state.
		for name, m := range p.modeled {
			if _, ok := changed[name]; !ok && st.stateAt(m.rec, now) != m.state {
				changed[name] = m.rec
			}
		}
		p.synced = now
	}
	if all {
		p.synced = now
		// Every node there is is in changed; those modeled that are not
		// went meanwhile.
		for name := range p.modeled {
			if _, ok := changed[name]; !ok {
				changed[name] = nil
			}
		}
	}
	for name, rec := range changed {
		if rec == nil {
			p.cluster.Remove(name)
			delete(p.modeled, name)
			continue
		}
		state := st.stateAt(rec, now)
		model := rec.model
		if model == nil || state != rec.state {
			model = modelOf(rec, state)
		}
		p.cluster.Put(name, model)
		p.modeled[name] = modeledNode{rec: rec, state: state}
	}
}

// resync is how often the placements look at every node's state: a tenth
// of the time after which a silent node is not_working.
func resync(staleAfter time.Duration) time.Duration { return max(staleAfter/10, 100*time.Millisecond) }

// modelOf is the placement engine's view of a node as its snapshot shows
// it. Which of an instance's units are free a snapshot does not say, only
// how many: the model takes the last ones of its range, so that the units an
// answer names are an estimate, and the answer names none. Nobody's uid is
// known to the collector, so one user per MPS instance is not judged here.
func modelOf(rec *record, state string) *placement.Node {
	n := &placement.Node{GPUs: make([]placement.GPU, len(rec.gpus))}
	for i := range rec.gpus {
		g, key := &rec.gpus[i], &rec.keys[i]
		pg := placement.GPU{Index: g.index, UUID: g.uuid, Name: g.name, MemoryTotalMiB: g.memoryTotalMiB,
			Free: key.free, Units: g.unitsTotal, Card: g.card, NUMANode: -1}
		// As the node sees it (docs/design.md §1.8): the least of the
		// memory its leases do not hold and the memory not used.
		if taken := max(g.memoryUsedMiB, g.memoryHeldMiB); taken < g.memoryTotalMiB {
			pg.MemoryFreeMiB = g.memoryTotalMiB - taken
		}
		switch {
		case state != api.NodeWorking:
			pg.Unusable = "its node is " + state
		case !key.eligible:
			pg.Unusable = "is not eligible (" + g.state + ")"
		}
		for k, in := range g.instances {
			n.ClientsPerInstance = max(n.ClientsPerInstance, in.clientsMax)
			pi := placement.Instance{Index: k, FreeUnits: unitRange(in.first+in.size-in.free, in.free), Size: in.size, Clients: in.clients}
			if !api.InstanceTakesLeases(in.state) {
				pi.Down = "is " + in.state
			}
			pg.Instances = append(pg.Instances, pi)
		}
		n.GPUs[i] = pg
	}
	return n
}

// unitIDs is the units 0, 1, 2, …: a model's free units are a range of
// them, which the engine only reads, so the models of the table share it.
var unitIDs = func() []int {
	ids := make([]int, 4096)
	for i := range ids {
		ids[i] = i
	}
	return ids
}()

// unitRange is the units [first, first+n).
func unitRange(first, n int) []int {
	if first >= 0 && first <= len(unitIDs) && n <= len(unitIDs)-first {
		// Capped: an append makes a copy, never writes into the others'.
		return unitIDs[first : first+n : first+n]
	}
	out := make([]int, n)
	for u := range out {
		out[u] = first + u
	}
	return out
}

// placements is POST /v1/placements: the best nodes for a request, by the
// same placement engine the nodes decide with, over their last snapshots.
func (s *Server) placements(w http.ResponseWriter, r *http.Request) error {
	caller, err := s.placementCaller(r.Header.Get("Authorization"))
	if err != nil {
		return err
	}
	placer := s.placer
	client := placementClient(caller, r.RemoteAddr)
	done, err := placer.asking.take(client, caller != "")
	if err != nil {
		pauseRefusal(r.Context())
		return err
	}
	defer done()
	limit := 1
	for k, v := range r.URL.Query() {
		if k != "limit" || len(v) != 1 {
			return api.Errorf(api.ErrBadRequest, "/v1/placements takes only ?limit=K (1 to %d), once", MaxPlacements)
		}
		n, err := strconv.Atoi(v[0])
		if err != nil || n < 1 || n > MaxPlacements {
			return api.Errorf(api.ErrBadRequest, "limit %q: a whole number from 1 to %d", v[0], MaxPlacements)
		}
		limit = n
	}
	req, err := decodePlacementRequest(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		return err
	}
	a, recs, err := placer.place(r.Context(), s.store, req, limit, caller, client)
	if err != nil {
		return err
	}
	out := PlacementList{Policy: string(placer.policy), Placements: make([]Placement, 0, len(a.Ranked)), Considered: a.Considered, Nodes: a.Nodes}
	for _, v := range a.Ranked {
		rec := recs[v.Node]
		p := Placement{Node: v.Node, GPU: leaseGPU(rec, v.Choice.GPU), Instance: v.Choice.Instance, FreeUnits: v.FreeUnits, Score: v.Best.Score}
		for _, g := range v.Choice.GPUs {
			p.GPUs = append(p.GPUs, leaseGPU(rec, g))
		}
		if len(v.Choice.GPUs) > 0 {
			p.GPU = p.GPUs[0]
		}
		out.Placements = append(out.Placements, p)
	}
	return writeJSON(w, http.StatusOK, out)
}

func leaseGPU(rec *record, index int) api.LeaseGPU {
	for i := range rec.gpus {
		if rec.gpus[i].index == index {
			return api.LeaseGPU{Index: index, UUID: rec.gpus[i].uuid}
		}
	}
	return api.LeaseGPU{Index: index}
}

// decodePlacementRequest reads and checks a placement request.
func decodePlacementRequest(body interface{ Read([]byte) (int, error) }) (cluster.Request, error) {
	var pr PlacementRequest
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&pr); err != nil {
		return cluster.Request{}, api.Errorf(api.ErrBadRequest, "placement request: %v", err)
	}
	if dec.More() {
		return cluster.Request{}, api.Errorf(api.ErrBadRequest, "placement request: more than one JSON value")
	}
	// More is false before a stray } or ], which end no value.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return cluster.Request{}, api.Errorf(api.ErrBadRequest, "placement request: trailing data after the JSON object")
	}
	return pr.check()
}

func (pr PlacementRequest) check() (cluster.Request, error) {
	switch {
	case pr.Pool != "":
		return cluster.Request{}, api.Errorf(api.ErrBadRequest, "pool %q: pools are each node's own config, which the collector does not see; ask the node (POST /v1/placements on its socket)", pr.Pool)
	case pr.Units < 0 || pr.GPUs < 0:
		return cluster.Request{}, api.Errorf(api.ErrBadRequest, "units and gpus must not be negative")
	case (pr.Units > 0) == (pr.GPUs > 0):
		return cluster.Request{}, api.Errorf(api.ErrBadRequest, "give units (of one GPU) or gpus (whole GPUs), one of them")
	case len(pr.Type) > 256 || strings.ContainsFunc(pr.Type, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return cluster.Request{}, api.Errorf(api.ErrBadRequest, "type: at most 256 printable characters")
	}
	r := cluster.Request{Request: placement.Request{Units: pr.Units, GPUs: pr.GPUs, MemoryMiB: pr.MemoryMiB, Type: pr.Type}}
	if pr.MinCC != "" {
		cc, err := api.ParseComputeCapability(pr.MinCC)
		if err != nil {
			return cluster.Request{}, api.Errorf(api.ErrBadRequest, "min_cc: %v", err)
		}
		r.MinCC = cc
	}
	return r, nil
}

// cardOf is a GPU's card as the score policy compares cards.
func cardOf(c api.Capability) placement.Card {
	cc, _ := api.ParseComputeCapability(c.ComputeCapability)
	return placement.Card{CC: cc, MemoryBandwidthGBps: c.MemoryBandwidthGBps, SMClockMHz: c.MaxSMClockMHz}
}

// PlacementMix is the answer of GET /v1/placements/mix: the request mix
// learned from the requests of POST /v1/placements, which --policy frag
// weighs (the others learn it too, and do not weigh it).
type PlacementMix struct {
	Policy string `json:"policy"`
	// Observed counts the requests learnt from since the collector
	// started: those placed for a caller of --learn-tokens-file.
	Observed uint64     `json:"observed"`
	Shapes   []MixShape `json:"shapes"`
}

// MixShape is one shape of the mix: requests of units of one GPU, or of
// gpus whole GPUs, of one type; Weight is their share of the requests
// remembered. A request's memory_mib and min_cc are no part of its shape.
type MixShape struct {
	Units  int     `json:"units,omitempty"`
	GPUs   int     `json:"gpus,omitempty"`
	Type   string  `json:"type,omitempty"`
	Weight float64 `json:"weight"`
}

// learned is the mix in force under frag, else the mix as last published.
func (p *placer) learned() PlacementMix {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := PlacementMix{Policy: string(p.policy), Observed: p.observed, Shapes: []MixShape{}}
	m := p.learner.Mix()
	if p.policy == placement.Frag {
		m = p.mix
	}
	if m != nil {
		for _, sh := range m.Shapes {
			out.Shapes = append(out.Shapes, MixShape{Units: sh.Units, GPUs: sh.GPUs, Type: sh.Type, Weight: sh.Weight})
		}
	}
	return out
}

// placementMix is GET /v1/placements/mix.
func (s *Server) placementMix(w http.ResponseWriter, r *http.Request) error {
	if err := s.checkRead(r.Header.Get("Authorization")); err != nil {
		return err
	}
	if len(r.URL.Query()) > 0 {
		return api.Errorf(api.ErrBadRequest, "/v1/placements/mix takes no query parameters")
	}
	return writeJSON(w, http.StatusOK, s.placer.learned())
}
