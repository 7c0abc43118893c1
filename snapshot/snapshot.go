// Package snapshot publishes the node's state as immutable values. The agent is
// the only writer; the API, the FUSE view and the reporter read the current value
// through Store.Load, which builds it from values the lease engine publishes and
// so takes no lock of the lease table, and wait for the next change through
// Store.Changed instead of polling.
package snapshot

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gpulet/gpulet/api"
)

// Published is one snapshot with everything readers derive from it. Nothing in
// it may be modified once it is stored.
type Published struct {
	Snapshot *api.Snapshot

	// The lease list, like the encodings, is made on first use, once: under
	// lease churn most snapshots are replaced before anyone reads them, and
	// most reads (the API's snapshot, the FUSE view's status files) need
	// neither.
	leasesOnce  sync.Once
	leases      []api.Lease
	listLeases  func() []api.Lease
	jsonOnce    sync.Once
	json        []byte
	jsonMade    atomic.Bool
	metricsOnce sync.Once
	metrics     []byte
	render      func(*api.Snapshot) []byte
	redacted    redacted
	// gpuParts, when set, hold each GPU's encoding, shared with the other
	// snapshots whose GPU reads the same.
	gpuParts []*GPUPart
}

// GPUPart is one GPU's JSON encoding, made on first use and kept for as
// long as the GPU reads the same: under lease churn on a large node a change
// touches one GPU, and the others' encodings are copied, not made again.
type GPUPart struct {
	once sync.Once
	json []byte
	err  error
}

// encode returns the encoding of g, which every snapshot sharing the part
// holds the same.
func (part *GPUPart) encode(g *api.GPU) ([]byte, error) {
	part.once.Do(func() { part.json, part.err = appendGPU(nil, g) })
	return part.json, part.err
}

// New builds a Published from a snapshot. leases lists the live leases at the
// moment of the snapshot, sorted by ID, and render produces the Prometheus
// text for Metrics; each runs at most once, on first use, and may be nil
// (no leases, no metrics).
func New(s *api.Snapshot, leases func() []api.Lease, render func(*api.Snapshot) []byte) *Published {
	return &Published{Snapshot: s, listLeases: leases, render: render}
}

// NewWithGPUParts is New for a snapshot whose GPU i is encoded as parts[i]
// is: the caller shares a part only between snapshots whose GPU i is the
// same.
func NewWithGPUParts(s *api.Snapshot, parts []*GPUPart, leases func() []api.Lease, render func(*api.Snapshot) []byte) *Published {
	p := New(s, leases, render)
	p.gpuParts = parts
	return p
}

// NewEncoded is New for a snapshot whose JSON encoding is already at hand:
// raw, which JSON then serves as it is (ending in a newline, as JSON's do).
func NewEncoded(s *api.Snapshot, raw []byte, leases func() []api.Lease, render func(*api.Snapshot) []byte) *Published {
	p := New(s, leases, render)
	p.jsonOnce.Do(func() { p.json = raw })
	return p
}

// Leases are all live leases at the moment of the snapshot, sorted by ID.
func (p *Published) Leases() []api.Lease {
	p.leasesOnce.Do(func() {
		if p.listLeases != nil {
			p.leases = p.listLeases()
		}
		if p.leases == nil {
			p.leases = []api.Lease{}
		}
	})
	return p.leases
}

// lastJSONSize is the length of the last snapshot encoded.
var lastJSONSize atomic.Int64

// JSON is the snapshot encoded once, so that every reader of this snapshot
// serves the same bytes.
func (p *Published) JSON() []byte {
	p.jsonOnce.Do(func() {
		// Sized by the last snapshot's encoding, which the next is nearly
		// always as long as: one allocation, no copies as it grows.
		last := int(lastJSONSize.Load())
		b, err := appendSnapshotJSON(make([]byte, 0, max(last+last/8, 4096)), p.Snapshot, p.gpuParts)
		if err != nil {
			// A snapshot holds only strings, numbers and slices of them.
			panic("gpulet: cannot encode snapshot: " + err.Error())
		}
		p.json = append(b, '\n')
		lastJSONSize.Store(int64(len(p.json)))
		p.jsonMade.Store(true)
	})
	return p.json
}

// scratch holds encodings that WithJSON lends, for the next to reuse.
var scratch sync.Pool

// WithJSON calls use with the snapshot's encoding, the bytes JSON returns,
// which are use's to read only until it returns. Once JSON has been made it
// lends that; until then it encodes into a buffer that the next call reuses.
// Under lease churn on a large node nearly every read of the API meets a
// snapshot that nobody has encoded yet, and a new encoding for each (57 KB
// on 16 GPUs with 10,000 leases) was garbage whose collection showed in
// leasing under readers (section 9 of
// docs/benchmarks/readers-push-collector-reservations-kubelet.md).
func (p *Published) WithJSON(use func([]byte)) {
	if p.jsonMade.Load() {
		use(p.json)
		return
	}
	buf, _ := scratch.Get().(*[]byte)
	if buf == nil {
		buf = new([]byte)
	}
	b, err := appendSnapshotJSON((*buf)[:0], p.Snapshot, p.gpuParts)
	if err != nil {
		panic("gpulet: cannot encode snapshot: " + err.Error())
	}
	b = append(b, '\n')
	use(b)
	*buf = b
	scratch.Put(buf)
}

// Metrics is the Prometheus text exposition of the snapshot, built on first use.
func (p *Published) Metrics() []byte {
	p.metricsOnce.Do(func() {
		if p.render != nil {
			p.metrics = p.render(p.Snapshot)
		}
	})
	return p.metrics
}

// Lease returns the live lease with the given id.
func (p *Published) Lease(id string) (api.Lease, bool) {
	leases := p.Leases()
	i, found := slices.BinarySearchFunc(leases, id, func(l api.Lease, id string) int { return strings.Compare(l.ID, id) })
	if !found {
		return api.Lease{}, false
	}
	return leases[i], true
}

// Store holds the current Published value. A Store with a builder is lazy:
// writers only mark it stale, and the first Load after that builds a fresh
// value. Every Load therefore sees every change that was complete when it
// began, while a burst of changes that nobody reads costs no snapshot at all.
// The zero Store holds whatever Store put there.
type Store struct {
	cur   atomic.Pointer[Published]
	build func() *Published
	// stale counts Invalidate calls; built is the count the current value
	// covers, stored only after the value itself.
	stale, built atomic.Uint64
	mu           sync.Mutex // serializes builds
	changed      signal
}

// signal is a broadcast to whoever waits for the next change. It makes a
// channel only when someone waits, so that changes nobody waits for (lease
// churn) cost no allocation.
type signal struct {
	mu sync.Mutex // guards ch
	ch chan struct{}
}

func (s *signal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func (s *signal) fire() {
	s.mu.Lock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
	s.mu.Unlock()
}

// SetBuilder makes the Store lazy: Load calls build (never concurrently) once
// the Store has been invalidated since its last build. Call it before any
// Load.
func (s *Store) SetBuilder(build func() *Published) { s.build = build }

// Invalidate says that the state behind the snapshot has changed, and wakes
// whoever waits on Changed.
func (s *Store) Invalidate() {
	s.stale.Add(1)
	s.changed.fire()
}

// Changed returns a channel that is closed at the next Invalidate. To wait for a
// snapshot newer than one already seen, take the channel first, then Load: a
// change between the two is then either in the loaded value or closes the
// channel.
func (s *Store) Changed() <-chan struct{} { return s.changed.wait() }

// Load returns the current value, building it first when it is stale; nil
// while nothing was stored or invalidated yet.
func (s *Store) Load() *Published {
	want := s.stale.Load()
	if s.build == nil || s.built.Load() >= want {
		return s.cur.Load()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.built.Load() >= want {
		return s.cur.Load()
	}
	// Changes marked from here on may or may not be in p: the next Load
	// builds again for them.
	covers := s.stale.Load()
	p := s.build()
	s.cur.Store(p)
	s.built.Store(covers)
	return p
}

// Store makes p the current value.
func (s *Store) Store(p *Published) { s.cur.Store(p) }
