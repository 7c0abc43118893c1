package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/journal"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/errdefs"
	"github.com/gpulet/gpulet/placement"
)

// newID makes a lease id of the form the journal takes back.
func newID() string {
	var b [journal.IDHexLen / 2]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return journal.IDPrefix + hex.EncodeToString(b[:])
}

type lease struct {
	// Lease is what the view and the API's answers show of the lease, and
	// they share it without the Manager's lock: it is never changed once
	// set. A change (a renewal, a pod's name) sets a changed copy (change),
	// under the lock.
	*api.Lease
	bind binding
	// seen marks the lease as counted in a build of its GPU's view.
	seen uint64
	// gpu, ownerUID and slurm are Lease's GPU.Index, Owner.UID and Slurm,
	// which no change touches, kept here so that a build of a GPU's view
	// reads no api.Lease: with hundreds of leases a GPU, those reads were most
	// of its cost.
	gpu      int
	ownerUID uint32
	slurm    *api.LeaseSlurm
	// holder is the process whose units (Manager.held) the lease counts
	// toward; nil for a lease bound to no process.
	holder *procKey
	// share is the share member a borrowed lease counts toward;
	// reclaiming says its holder was told to end (reservation.go).
	share      string
	reclaiming bool
	// memMiB, units and whole are Lease's MemoryMiB, len(Units) and whether
	// it is of whole GPUs, kept for the GPU memory it holds (heldMiB).
	memMiB uint64
	units  int
	whole  bool
}

// newTableLease is the table's record of pub, which it keeps.
func newTableLease(pub *api.Lease, bind binding, share string) *lease {
	return &lease{Lease: pub, bind: bind, share: share, gpu: pub.GPU.Index, ownerUID: pub.Owner.UID, slurm: pub.Slurm,
		memMiB: pub.MemoryMiB, units: len(pub.Units), whole: len(pub.GPUs) > 0}
}

// change sets a copy of the lease that f changed; whoever holds the value
// before keeps it as it was.
func (l *lease) change(f func(*api.Lease)) {
	next := *l.Lease
	f(&next)
	l.Lease = &next
}

// encodeLease is pub as the API answers it and the journal records it. Only
// a grant needs it: the lease keeps no encoding, which would cost more memory
// than the rest of it, and a journal rewrite encodes each lease again as it
// writes it (appendLeaseRecord).
func encodeLease(pub *api.Lease) []byte {
	b, ok := journal.AppendLease(make([]byte, 0, 512), pub)
	if !ok {
		var err error
		if b, err = json.Marshal(pub); err != nil {
			// A lease holds only strings, numbers, times and maps of strings.
			panic("gpulet: cannot encode lease: " + err.Error())
		}
	}
	return b
}

// Grant is a granted lease and its JSON encoding.
type Grant struct {
	api.Lease
	// JSON is Lease encoded, as the API answers it.
	JSON []byte
}

// grant is the answer to a request that l serves, a lease granted before:
// it is encoded again. (A new lease's answer shares the encoding made for its
// journal record: tryGrantLocked.)
func (l *lease) grant() Grant { return Grant{Lease: *l.Lease, JSON: encodeLease(l.Lease)} }

type waiter struct {
	peer identity.Peer
	req  Request
	bind binding
	// since is when it began to wait; holding says freed units have been
	// held for it (fairness.go).
	since   time.Time
	holding bool
	// done gets the grant, made under the lock, or nil when the Manager
	// closes.
	done chan *Grant
}

var errStopping = errdefs.Errorf(errdefs.ErrUnavailable, "gpuletd is stopping")

// Acquire grants a lease for req to peer, waiting up to req.Wait for units.
func (m *Manager) Acquire(ctx context.Context, peer identity.Peer, req Request) (Grant, error) {
	if req.Units > m.cfg.Model.UnitsPerClient {
		return Grant{}, errdefs.Errorf(errdefs.ErrInvalid, "units: %d is more than one process may hold (--units-per-client %d)", req.Units, m.cfg.Model.UnitsPerClient)
	}
	bind, err := m.bindingFor(peer, req)
	if err != nil {
		return Grant{}, err
	}
	if !m.lockOpen() {
		bind.release()
		return Grant{}, errStopping
	}
	for _, f := range m.features {
		if g, found, err := f.answerLocked(peer, req, bind); found {
			m.unlock()
			bind.release()
			return g, err
		}
	}
	g, err := grantLocked(m, peer, req, bind, nil)
	if err == nil || req.Wait == 0 || !errors.Is(err, errdefs.ErrNoCapacity) || errors.Is(err, placement.ErrNeverFits) {
		return m.answerLocked(g, err, bind)
	}
	release, err := m.waitCap.take(peer.UID, m.cfg.MaxWaitersPerUID)
	if err != nil {
		m.unlock()
		bind.release()
		return Grant{}, err
	}
	defer release()
	w := &waiter{peer: peer, req: req, bind: bind, since: m.cfg.Clock.Now(), done: make(chan *Grant, 1)}
	m.waiters = append(m.waiters, w)
	m.unlock()

	timer := time.NewTimer(req.Wait)
	defer timer.Stop()
	select {
	case g := <-w.done:
		return m.served(ctx, g)
	case <-timer.C:
	case <-ctx.Done():
	}
	m.mu.Lock()
	if i := slices.Index(m.waiters, w); i >= 0 {
		m.waiters = slices.Delete(m.waiters, i, i+1)
		if ctx.Err() != nil {
			m.unlock()
			bind.release()
			return Grant{}, errCancelled
		}
		// One last try, whose refusal is the answer: it says what keeps the
		// request out now.
		g, err := grantLocked(m, peer, req, bind, nil)
		if err != nil {
			err = fmt.Errorf("after waiting %s: %w", req.Wait, err)
		}
		return m.answerLocked(g, err, bind)
	}
	m.unlock()
	// Granted just as we gave up.
	return m.served(ctx, <-w.done)
}

// answerLocked answers a grant (g) or its refusal (err) and unlocks. The
// answer was copied under the lock (tryGrantLocked): the lease is listed at
// once, so its owner may renew it while the answer goes out. A refused
// request's binding is let go.
func (m *Manager) answerLocked(g Grant, err error, bind binding) (Grant, error) {
	m.unlock()
	if err != nil {
		bind.release()
		return Grant{}, err
	}
	return g, nil
}

var errCancelled = errdefs.Errorf(errdefs.ErrUnavailable, "request cancelled while waiting for units")

// served answers a waiter whose request another goroutine granted (g), or
// that the Manager's closing let go (nil). A grant made just as the caller
// went away is ended: nobody would get the lease.
func (m *Manager) served(ctx context.Context, g *Grant) (Grant, error) {
	if g == nil {
		return Grant{}, errStopping
	}
	if ctx.Err() != nil {
		m.end(g.ID, "requester went away while waiting")
		return Grant{}, errCancelled
	}
	m.settle()
	return *g, nil
}

// settle waits for the change that served a waiter to be published and tells
// OnChange: the waiter's answer must not go out before the snapshot can show
// its lease. The grant was made under the lock by another goroutine, which
// publishes before it lets go of it.
func (m *Manager) settle() {
	m.mu.Lock()
	m.pub.publishLocked()
	m.mu.Unlock()
	m.cfg.OnChange()
}

func (m *Manager) placementRequest(peer identity.Peer, req Request) placement.Request {
	r := placement.Request{Units: req.Units, GPUs: req.GPUs, GPU: req.GPU, Type: req.Type, MemoryMiB: req.MemoryMiB, MinCC: req.MinCapability, UID: peer.UID,
		Pool: req.Pool, Admin: peer.Admin}
	if !m.engine.Load().Open() {
		r.GIDs = peer.GIDs()
	}
	if m.cfg.Profiles != nil && req.Task != "" {
		r.Prefer = m.cfg.Profiles.Prefer(peer.UID, req.Task)
	}
	return r
}

// tryGrantLocked places and grants req, or says why it cannot now. The
// grant's answer is the lease as granted and the encoding its journal record
// was made with.
func (m *Manager) tryGrantLocked(peer identity.Peer, req Request, bind binding) (Grant, error) {
	if m.journal.Failed() != nil {
		return Grant{}, unrecorded("no lease is granted", m.journal.Failed())
	}
	if pb, ok := bind.(*pidBinding); ok && req.GPUs == 0 {
		if err := m.processCap(pb.pid, m.held[pb.key()], req.Units); err != nil {
			return Grant{}, err
		}
	}
	if err := m.checkQuotaLocked(peer, requestUnits(m.cfg.Model, req), req.Reservation); err != nil {
		return Grant{}, err
	}
	for {
		// Reservations: a draw, or a borrow where ordinary units are short.
		d, dr, err := m.placeLocked(peer, req)
		if err != nil {
			return Grant{}, err
		}
		c := d.Choice
		if retry, err := m.fifos.createChoiceLocked(c); err != nil {
			return Grant{}, err
		} else if retry {
			continue
		}
		l := m.newLease(peer, req, bind, c, dr)
		m.addLocked(l)
		enc := encodeLease(l.Lease)
		if err := m.rec.recordLocked(journal.Record{Op: journal.OpLease, Entry: l.entry(enc)}); err != nil {
			// The binding stays its caller's (Acquire, or a waiter that may be
			// served later): dropping the lease must not release it.
			l.bind = nil
			m.dropLocked(l)
			return Grant{}, unrecorded("the lease is not granted", err)
		}
		bind.armLocked(m, l)
		m.granted++
		if m.lines.due() {
			attrs := []slog.Attr{slog.String("lease", l.ID), slog.Int("gpu", c.GPU), slog.Int("instance", c.Instance),
				slog.Any("units", l.Units), slog.Uint64("uid", uint64(peer.UID)), slog.Int("pid", l.Owner.PID), slog.String("ttl", l.TTL)}
			if len(c.GPUs) > 0 {
				attrs = append(attrs, slog.Any("gpus", c.GPUs))
			}
			m.infoLocked("lease granted", attrs...)
		}
		return Grant{Lease: *l.Lease, JSON: enc}, nil
	}
}

// isInsufficient reports whether err is a refusal for want of units.
func isInsufficient(err error) bool { return errors.Is(err, errdefs.ErrNoCapacity) }

// placeLocked decides where req goes: a feature places a request that names
// what it holds (a reservation); any other goes to ordinary free units, and,
// when those are short, a feature may place it on units of its own (a
// borrow from a reservation that lends to the caller).
func (m *Manager) placeLocked(peer identity.Peer, req Request) (placement.Decision, *draw, error) {
	eng := m.engine.Load()
	pr := m.placementRequest(peer, req)
	for _, f := range m.features {
		if d, dr, ok, err := f.placeLocked(eng, peer, req, pr); ok {
			return d, dr, err
		}
	}
	d, err := eng.Place(m.pub.nodeLocked(), pr)
	if err == nil || !isInsufficient(err) || errors.Is(err, placement.ErrNeverFits) {
		return d, nil, err
	}
	for _, f := range m.features {
		if fd, dr, ok, ferr := f.shortLocked(eng, peer, req, pr, err); ok {
			return fd, dr, ferr
		}
	}
	return d, nil, err
}

// processCap refuses units more for a process that holds held already, past
// what one process may hold (M, --units-per-client).
func (m *Manager) processCap(pid, held, units int) error {
	if held+units > m.cfg.Model.UnitsPerClient {
		return errdefs.Errorf(errdefs.ErrInvalid, "units: process %d holds %d unit(s) already; one process may hold at most %d (--units-per-client)", pid, held, m.cfg.Model.UnitsPerClient)
	}
	return nil
}

// addLocked puts a new or restored lease in the table.
func (m *Manager) addLocked(l *lease) {
	for _, g := range gpusOf(l.Lease) {
		for _, u := range l.Units {
			s := &m.gpus[g].slots[u]
			s.state, s.lease = slotLeased, l
		}
		m.touchLocked(g)
	}
	m.leases[l.ID] = l
	m.quotaUse.add(l.Owner.UID, identity.GroupsOf(l.Owner.GID, l.Owner.Groups), unitsHeld(l.Lease))
	// A whole-GPU lease runs without MPS: the per-client cap does not bind it.
	if pb, ok := l.bind.(*pidBinding); ok && len(l.GPUs) == 0 {
		key := pb.key()
		l.holder = &key
		m.held[key] += len(l.Units)
	}
}

func (m *Manager) newLease(peer identity.Peer, req Request, bind binding, c placement.Choice, dr *draw) *lease {
	dev := m.gpus[c.GPU].dev
	now := m.clock.Now().UTC()
	pub := api.Lease{
		ID:          newID(),
		GPU:         api.LeaseGPU{Index: c.GPU, UUID: dev.UUID},
		Instance:    c.Instance,
		Units:       c.Units,
		Owner:       api.Owner{UID: peer.UID, GID: peer.GID, Groups: peer.Groups},
		Created:     now,
		Binding:     string(bind.kind()),
		Reservation: dr.name(),
		Preemptible: dr.borrowed(),
		Task:        req.Task,
		Labels:      req.Labels,
		MemoryMiB:   req.MemoryMiB,
	}
	switch b := bind.(type) {
	case *pidBinding:
		pub.Owner.PID = b.pid
	case *ttlBinding:
		b.deadline = now.Add(b.ttl)
		exp := b.deadline
		pub.Expires = &exp
		pub.TTL = b.ttl.String()
	case *slurmBinding:
		job := b.job
		pub.Slurm = &job
	}
	if len(c.GPUs) > 0 {
		pub.Units = allUnits(m.cfg.Model)
		devs := make([]inventory.Device, len(c.GPUs))
		for i, g := range c.GPUs {
			devs[i] = m.gpus[g].dev
			pub.GPUs = append(pub.GPUs, api.LeaseGPU{Index: g, UUID: devs[i].UUID})
		}
		pub.Env = WholeEnv(devs)
	} else {
		pub.Env = m.sharedEnvLocked(&pub, EnvFor(m.cfg.Model, dev, instanceEnv(m.cfg.InstanceEnv, c.GPU, c.Instance), m.cfg.MPS, len(c.Units), req.MemoryMiB))
	}
	return newTableLease(&pub, bind, dr.member())
}

// instanceEnv is the MPS variables of instance k of GPU g among envs
// (Config.InstanceEnv); nil when MPS is off.
func instanceEnv(envs [][]map[string]string, g, k int) map[string]string {
	if g >= len(envs) || k >= len(envs[g]) {
		return nil
	}
	return envs[g][k]
}

// SetConditions puts the agent's new conditions in force and serves the
// waiting requests that they (a GPU below the utilization threshold again, an Xid cleared,
// an MPS instance back, the node undrained) may let in.
func (m *Manager) SetConditions(c *Conditions) {
	m.conditions.Store(c)
	if !m.lockOpen() {
		return
	}
	m.serveWaitersLocked()
	m.unlock()
}

// serveWaitersLocked grants waiting requests, oldest first, while they fit.
// Pending reservations go first: units freed while one waits are held for it.
func (m *Manager) serveWaitersLocked() {
	for _, f := range m.features {
		f.admitLocked()
	}
	// While freed units are held for one waiter, only it is tried; once it
	// is served the others are tried from the first again.
	h := holderLocked(m)
	for i := 0; i < len(m.waiters); {
		w := m.waiters[i]
		if h != nil && w != h {
			i++
			continue
		}
		g, err := m.tryGrantLocked(w.peer, w.req, w.bind)
		if err != nil {
			i++
			continue
		}
		m.waiters = slices.Delete(m.waiters, i, i+1)
		w.done <- &g
		if w == h {
			h, i = holderLocked(m), 0
		}
	}
}
