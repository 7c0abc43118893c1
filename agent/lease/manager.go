// Package lease is the lease engine: it owns the unit table of every GPU (which
// unit is free, leased, or claimed offline), grants and ends leases, binds them
// to a process or to time, keeps the journal, and reconciles with the pipe-file
// ledger. Everything else reads the table through View.
package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/agent/placement"
	"github.com/gpulet/gpulet/agent/procwatch"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/api"
)

const (
	idPrefix = "l-"
	idHexLen = 16
)

func newID() string {
	var b [idHexLen / 2]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return idPrefix + hex.EncodeToString(b[:])
}

// Conditions is what the agent knows of the GPUs beyond units: the manager
// places only where it allows.
type Conditions struct {
	Draining bool
	GPUs     []GPUCondition
}

// GPUCondition is one GPU's conditions.
type GPUCondition struct {
	// Eligible is false when the GPU is not working or too busy.
	Eligible bool
	// Why says why it is not eligible.
	Why           string
	MemoryFreeMiB uint64
	// InstanceUp says per instance whether it may take new leases.
	InstanceUp []bool
	// ServerUID is, per instance, the uid of its live MPS server (nil: none).
	ServerUID []*uint32
}

// Peer is who calls, as SO_PEERCRED and SO_PEERGROUPS told when it connected.
type Peer struct {
	UID, GID uint32
	PID      int
	Admin    bool

	// Groups are the caller's supplementary groups.
	Groups []uint32
	// PIDFD, when not nil, holds the process that connected (SO_PEERPIDFD):
	// a lease bound to the caller's own process is bound to exactly it. Who
	// made the Peer closes it (the API server, when the request is done);
	// Acquire keeps a duplicate of what it needs.
	PIDFD *os.File
}

// Config wires a Manager.
type Config struct {
	Model   units.Model
	Devices []inventory.Device
	Ledger  *ledger.Ledger
	// JournalPath is where live leases are recorded (<run-dir>/leases.journal).
	JournalPath string
	Policy      placement.Policy
	// Conditions returns the current conditions; it must not call the Manager.
	Conditions func() *Conditions
	// InstanceEnv returns the MPS variables of instance k of GPU g (pipe and log
	// folders); nil or an empty map when MPS is off.
	InstanceEnv func(g, k int) map[string]string
	// MPS adds the MPS-only variables (pinned memory limit) to leases, and
	// keeps users apart: an MPS server runs as one user and clients of another
	// user queue behind it, so a lease never goes to an instance whose clients
	// belong to another uid.
	MPS bool
	// OnChange is called, without the Manager's lock, after every change of the
	// table; the agent publishes a new snapshot from it.
	OnChange func()
	Logger   *slog.Logger
	Now      func() time.Time

	// MaxWaitersPerUID caps the requests one uid (root aside) may have
	// queued for units; 0: no cap.
	MaxWaitersPerUID int
}

type slotState uint8

const (
	slotFree slotState = iota
	slotLeased
	slotOffline
)

type slot struct {
	state slotState
	lease *lease // when leased
	// own counts the daemon's own makes and removals of this unit's FIFO
	// whose watch events have not arrived yet. Events of one name arrive in
	// order, so the next that many are the daemon's own and change nothing;
	// should one stand in for a claimer's event instead, the daemon's own
	// event comes after it and is looked at, so the slot still ends up true.
	// A rescan, which makes every slot true, resets it.
	own uint32
	// uid and fifo are the owner and identity of an offline claim's FIFO.
	uid  uint32
	fifo ledger.FileID
}

type gpuTable struct {
	dev   inventory.Device
	slots []slot
}

type lease struct {
	api.Lease
	// json is the encoding of Lease, made once per change of it: the journal
	// record and the API's answer share it.
	json      []byte
	startTime uint64
	ttl       time.Duration
	deadline  time.Time
	proc      *procwatch.Process
	timer     *time.Timer
}

// binding is how a lease will end: its process, or its ttl.
type binding struct {
	proc      *procwatch.Process
	pid       int
	startTime uint64
	ttl       time.Duration
}

type waiter struct {
	peer Peer
	req  Request
	bind binding
	// done gets the grant, made under the lock, or nil when the Manager
	// closes.
	done chan *Grant
}

// Manager owns the unit table.
type Manager struct {
	cfg Config
	log *slog.Logger

	mu sync.Mutex // guards gpus, leases, waiters and journal writes
	// gpus is the unit table, by GPU index.
	gpus []*gpuTable
	// leases are the live leases by id.
	leases map[string]*lease
	// waiters are requests waiting for units, oldest first.
	waiters []*waiter
	// waitCap counts waiters per uid.
	waitCap uidCap
	// journal records live leases; written under mu.
	journal journal
	// pendingLogs are log lines made under mu, written by unlock once mu is
	// free: a slow log sink must not hold up leasing.
	pendingLogs []pendingLog
	// eventChanged records that ledger events changed the table since their
	// last batch was published, so that the daemon's own FIFOs coming and
	// going publish nothing.
	eventChanged bool
	closed       bool
	// granted and ended count leases since New.
	granted, ended uint64
	// lines is the budget of per-lease log lines.
	lines lineBudget
}

// leaseLinesPerSecond bounds the "lease granted" and "lease ended" lines.
// Past it, lines are counted instead, and one line says how many were left
// out: under heavy churn the lines cost more than the leases, and journald's
// default rate limit (10,000 lines per 30 s per service) would drop them
// anyway. gpulet_leases_granted_total and gpulet_leases_ended_total count
// every lease.
const leaseLinesPerSecond = 100

type lineBudget struct {
	window  time.Time // start of the current second
	used    int
	skipped int
}

// New builds the Manager, takes back what the journal and the ledger hold, and
// removes what is stale. It does not watch yet: call Watch.
func New(cfg Config) (*Manager, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.OnChange == nil {
		cfg.OnChange = func() {}
	}
	if cfg.InstanceEnv == nil {
		cfg.InstanceEnv = func(int, int) map[string]string { return nil }
	}
	m := &Manager{cfg: cfg, log: cfg.Logger, leases: map[string]*lease{}, journal: journal{path: cfg.JournalPath}}
	for _, d := range cfg.Devices {
		m.gpus = append(m.gpus, &gpuTable{dev: d, slots: make([]slot, cfg.Model.UnitsPerGPU)})
	}
	m.restore()
	// Claims nobody holds go before the daemon serves.
	m.probeOffline()
	return m, nil
}

// restore takes back the journal's leases whose holder still lives or whose
// deadline has not passed, counts every other FIFO as an offline claim, and
// removes the claims nobody holds.
func (m *Manager) restore() {
	m.mu.Lock()
	defer m.unlock()
	var entries []journalEntry
	b, err := os.ReadFile(m.cfg.JournalPath)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		m.log.Error("lease journal unreadable; rebuilding from the pipe-file ledger", "path", m.cfg.JournalPath, "err", err)
	default:
		var dropped []string
		entries, dropped, err = decodeJournal(b, m.shapes())
		if err != nil {
			m.log.Error("lease journal damaged: keeping the leases recorded before the damage, the rest is rebuilt from the pipe-file ledger", "path", m.cfg.JournalPath, "err", err, "kept", len(entries))
		}
		for _, d := range dropped {
			m.log.Warn("lease journal entry dropped", "entry", d)
		}
	}
	now := m.cfg.Now()
	for _, e := range entries {
		l := &lease{Lease: e.Lease, startTime: e.StartTime, ttl: time.Duration(e.TTLNanos)}
		l.encode()
		if e.Deadline != nil {
			if !now.Before(*e.Deadline) {
				m.log.Info("lease expired while the daemon was down", "lease", l.ID)
				m.removeFIFOs(l)
				continue
			}
			l.deadline = *e.Deadline
		} else {
			p, _, err := procwatch.Open(l.Owner.PID, l.startTime)
			if err != nil {
				m.log.Info("lease holder exited while the daemon was down", "lease", l.ID, "pid", l.Owner.PID)
				m.removeFIFOs(l)
				continue
			}
			l.proc = p
		}
		if taken := m.recreateFIFOsLocked(l); taken >= 0 {
			m.log.Warn("lease dropped: while the daemon was down its pipe file was removed and the unit claimed offline", "lease", l.ID, "unit", taken)
			if l.proc != nil {
				l.proc.Close()
			}
			continue
		}
		g := m.gpus[l.GPU.Index]
		for _, u := range l.Units {
			g.slots[u].state, g.slots[u].lease = slotLeased, l
		}
		m.leases[l.ID] = l
		m.armLocked(l)
		m.log.Info("lease kept across daemon restart", "lease", l.ID, "gpu", l.GPU.Index, "units", l.Units)
	}
	m.rescanLocked()
	if err := m.journal.rewrite(m.entriesLocked()); err != nil {
		m.log.Error("cannot write lease journal", "err", err)
	}
}

// recreateFIFOsLocked makes the missing FIFOs of a lease kept from the
// journal. When an offline claimer holds one of its units now, it removes the
// lease's own FIFOs again, leaves the claimer's, and returns that unit; else -1.
func (m *Manager) recreateFIFOsLocked(l *lease) int {
	for _, u := range l.Units {
		var err error
		switch {
		case m.cfg.Ledger.Present(l.GPU.Index, u) && m.cfg.Ledger.Held(l.GPU.Index, u):
			// The daemon never locks its own FIFOs: this one is a claimer's.
			err = ledger.ErrTaken
		case m.cfg.Ledger.Present(l.GPU.Index, u):
			continue
		default:
			err = m.createFIFOLocked(l.GPU.Index, u)
		}
		if errors.Is(err, ledger.ErrTaken) {
			for _, v := range l.Units {
				if v != u {
					m.removeFIFOLocked(l.GPU.Index, v)
				}
			}
			return u
		}
		if err != nil {
			m.log.Error("cannot recreate pipe file of a kept lease", "lease", l.ID, "err", err)
		}
	}
	return -1
}

func (m *Manager) shapes() []gpuShape {
	out := make([]gpuShape, len(m.gpus))
	for i, g := range m.gpus {
		out[i] = gpuShape{UUID: g.dev.UUID, UnitsTotal: m.cfg.Model.UnitsPerGPU, InstanceOf: m.cfg.Model.InstanceOf, UnitsPerMax: m.cfg.Model.UnitsPerClient}
	}
	return out
}

type pendingLog struct {
	msg   string
	attrs []slog.Attr
}

// lockOpen takes mu and reports true, or, once the Manager is closed, takes
// nothing and reports false: a closed Manager changes nothing, so that the
// next start finds the leases as they were.
func (m *Manager) lockOpen() bool {
	m.mu.Lock()
	if m.closed {
		m.unlock()
		return false
	}
	return true
}

// infoLocked queues an info line for unlock to write.
func (m *Manager) infoLocked(msg string, attrs ...slog.Attr) {
	m.pendingLogs = append(m.pendingLogs, pendingLog{msg, attrs})
}

// unlock releases mu, then writes the lines queued under it. They go to the
// handler directly, as records without a caller's pc: slog.Logger would walk
// the stack for one on every line, and these lines name their lease instead.
func (m *Manager) unlock() {
	logs := m.pendingLogs
	m.pendingLogs = nil
	m.mu.Unlock()
	if len(logs) == 0 {
		return
	}
	ctx, h := context.Background(), m.log.Handler()
	if !h.Enabled(ctx, slog.LevelInfo) {
		return
	}
	for _, l := range logs {
		r := slog.NewRecord(time.Now(), slog.LevelInfo, l.msg, 0)
		r.AddAttrs(l.attrs...)
		h.Handle(ctx, r)
	}
}

// leaseLineLocked queues a per-lease info line within the budget of
// leaseLinesPerSecond, and counts it when the budget is spent.
func (m *Manager) leaseLineLocked(msg string, attrs ...slog.Attr) {
	m.rollLinesLocked()
	if m.lines.used >= leaseLinesPerSecond {
		m.lines.skipped++
		return
	}
	m.lines.used++
	m.infoLocked(msg, attrs...)
}

// rollLinesLocked starts a new second of the line budget once the current
// one is over, saying first how many lines it left out.
func (m *Manager) rollLinesLocked() {
	now := m.cfg.Now()
	if d := now.Sub(m.lines.window); d >= 0 && d < time.Second {
		return
	}
	if m.lines.skipped > 0 {
		m.infoLocked("lease lines left out: more than the budget a second", slog.Int("left_out", m.lines.skipped),
			slog.Int("budget", leaseLinesPerSecond), slog.Time("since", m.lines.window))
	}
	m.lines = lineBudget{window: now}
}

// Tick does what the agent does every sample interval: it probes offline
// claims and says how many lease lines the last second left out.
func (m *Manager) Tick() {
	m.mu.Lock()
	m.rollLinesLocked()
	m.unlock()
	m.ProbeOffline()
}

// Watch starts watching the ledger for offline claims until ctx ends.
func (m *Manager) Watch(ctx context.Context) error {
	if err := m.cfg.Ledger.Watch(ctx, (*ledgerEvents)(m)); err != nil {
		return err
	}
	// Claims made between restore and the watch being in place are found here.
	m.Rescan()
	return nil
}

// ledgerEvents adapts the Manager to ledger.Handler without exporting the
// methods on Manager itself.
type ledgerEvents Manager

func (e *ledgerEvents) Units(events []ledger.UnitEvent) bool {
	m := (*Manager)(e)
	if !m.lockOpen() {
		return false
	}
	for _, ev := range events {
		s := &m.gpus[ev.GPU].slots[ev.Unit]
		if s.own > 0 {
			s.own--
			continue
		}
		// A leased unit's FIFO appearing, and a free unit's going, change
		// nothing either: skip the look at the file.
		switch {
		case s.state == slotLeased && !ev.Gone, s.state == slotFree && ev.Gone:
			continue
		}
		m.applyLocked(ev.GPU, ev.Unit, m.cfg.Ledger.Present(ev.GPU, ev.Unit))
	}
	if m.eventChanged {
		m.serveWaitersLocked()
	}
	changed := m.eventChanged
	m.eventChanged = false
	m.unlock()
	if changed {
		m.cfg.OnChange()
	}
	return changed
}

func (e *ledgerEvents) Rescan() { (*Manager)(e).Rescan() }

// Rescan lists the whole ledger again and publishes.
func (m *Manager) Rescan() {
	if !m.lockOpen() {
		return
	}
	m.rescanLocked()
	// Published just below: the next batch of events owes nothing.
	m.eventChanged = false
	m.unlock()
	m.cfg.OnChange()
}

func (m *Manager) rescanLocked() {
	for gi, g := range m.gpus {
		present, err := m.cfg.Ledger.Scan(gi)
		if err != nil {
			m.log.Error("cannot list the pipe-file ledger", "gpu", gi, "err", err)
			continue
		}
		seen := make([]bool, len(g.slots))
		for _, i := range present {
			seen[i] = true
		}
		for i := range g.slots {
			g.slots[i].own = 0
			m.applyLocked(gi, i, seen[i])
		}
	}
	m.serveWaitersLocked()
}

func (m *Manager) applyLocked(g, i int, present bool) {
	s := &m.gpus[g].slots[i]
	switch {
	case s.state == slotFree && present:
		s.state = slotOffline
		s.uid, s.fifo, _ = m.cfg.Ledger.Stat(g, i)
		m.eventChanged = true
	case s.state == slotOffline && present:
		// The FIFO may have been replaced by another claimer's (a remove and a
		// create coalesced): the probe must name the FIFO that is there now.
		if uid, id, ok := m.cfg.Ledger.Stat(g, i); ok && id != s.fifo {
			s.uid, s.fifo = uid, id
			m.eventChanged = true
		}
	case s.state == slotOffline && !present:
		*s = slot{own: s.own}
		m.eventChanged = true
	case s.state == slotLeased && !present:
		// Someone removed a lease's pipe file; the lease still holds the unit,
		// so the file comes back and the count stays right.
		m.log.Warn("pipe file of a live lease was removed; recreating it", "lease", s.lease.ID, "gpu", g, "unit", i)
		if err := m.createFIFOLocked(g, i); err != nil && !errors.Is(err, ledger.ErrTaken) {
			m.log.Error("cannot recreate pipe file", "err", err)
		}
	}
}

// ProbeOffline removes offline claims whose FIFO nobody holds locked; the agent
// calls it every sample interval. The files are probed without the lock, so
// that leasing does not wait on a node with thousands of claims; each probe
// names the FIFO it expects, so a unit that changed hands meanwhile is left
// alone.
func (m *Manager) ProbeOffline() {
	if m.probeOffline() {
		m.cfg.OnChange()
	}
}

// probeOffline does ProbeOffline's work and reports whether the table changed.
func (m *Manager) probeOffline() bool {
	type claim struct {
		g, i int
		fifo ledger.FileID
	}
	if !m.lockOpen() {
		return false
	}
	var claims []claim
	for gi, g := range m.gpus {
		for i, s := range g.slots {
			if s.state == slotOffline {
				claims = append(claims, claim{gi, i, s.fifo})
			}
		}
	}
	m.unlock()
	var gone []claim
	for _, c := range claims {
		stale, err := m.cfg.Ledger.Probe(c.g, c.i, c.fifo)
		if err != nil {
			m.log.Warn("cannot probe offline claim", "gpu", c.g, "unit", c.i, "err", err)
			continue
		}
		if stale {
			m.log.Info("removed stale offline claim: its pipe file was not locked by any process", "gpu", c.g, "unit", c.i)
			gone = append(gone, c)
		}
	}
	if len(gone) == 0 {
		return false
	}
	if !m.lockOpen() {
		return false
	}
	for _, c := range gone {
		m.applyLocked(c.g, c.i, m.cfg.Ledger.Present(c.g, c.i))
	}
	m.serveWaitersLocked()
	m.eventChanged = false
	m.unlock()
	return true
}

// Grant is a granted lease and its JSON encoding.
type Grant struct {
	api.Lease
	// JSON is Lease encoded, as the API answers it.
	JSON []byte
}

func (l *lease) grant() Grant { return Grant{Lease: l.Lease, JSON: l.json} }

// Acquire grants a lease for req to peer, waiting up to req.Wait for units.
func (m *Manager) Acquire(ctx context.Context, peer Peer, req Request) (Grant, error) {
	if err := m.checkRequest(req); err != nil {
		return Grant{}, err
	}
	bind, err := m.bindingFor(peer, req)
	if err != nil {
		return Grant{}, err
	}
	if !m.lockOpen() {
		bind.close()
		return Grant{}, api.Errorf(api.ErrUnavailable, "gpuletd is stopping")
	}
	l, err := m.tryGrantLocked(peer, req, bind)
	if err == nil || req.Wait == 0 || !errors.Is(err, api.ErrInsufficientUnits) {
		var g Grant
		if err == nil {
			// Under the lock: a renewal may change the lease once it is out.
			g = l.grant()
		}
		m.unlock()
		if err != nil {
			bind.close()
			return Grant{}, err
		}
		m.cfg.OnChange()
		return g, nil
	}
	release, err := m.waitCap.take(peer.UID, m.cfg.MaxWaitersPerUID)
	if err != nil {
		m.unlock()
		bind.close()
		return Grant{}, err
	}
	defer release()
	w := &waiter{peer: peer, req: req, bind: bind, done: make(chan *Grant, 1)}
	m.waiters = append(m.waiters, w)
	m.unlock()

	timer := time.NewTimer(req.Wait)
	defer timer.Stop()
	select {
	case g := <-w.done:
		if g == nil {
			return Grant{}, api.Errorf(api.ErrUnavailable, "gpuletd is stopping")
		}
		// Whoever served the wait publishes after its unlock; this answer
		// must not go out before the snapshot can show the lease.
		m.cfg.OnChange()
		return *g, nil
	case <-timer.C:
	case <-ctx.Done():
	}
	m.mu.Lock()
	if i := slices.Index(m.waiters, w); i >= 0 {
		m.waiters = slices.Delete(m.waiters, i, i+1)
		shortage := m.shortageLocked(req)
		m.unlock()
		bind.close()
		if ctx.Err() != nil {
			return Grant{}, api.Errorf(api.ErrUnavailable, "request cancelled while waiting for units")
		}
		return Grant{}, api.Errorf(api.ErrInsufficientUnits, "%s after waiting %s", shortage, req.Wait)
	}
	m.unlock()
	// Granted just as we gave up: keep it unless the caller is gone.
	g := <-w.done
	if g == nil {
		return Grant{}, api.Errorf(api.ErrUnavailable, "gpuletd is stopping")
	}
	if ctx.Err() != nil {
		m.end(g.ID, "requester went away while waiting")
		return Grant{}, api.Errorf(api.ErrUnavailable, "request cancelled while waiting for units")
	}
	m.cfg.OnChange()
	return *g, nil
}

// checkRequest refuses what no state of the node could satisfy.
func (m *Manager) checkRequest(req Request) error {
	if req.Units > m.cfg.Model.UnitsPerClient {
		return api.Errorf(api.ErrBadRequest, "units: %d is more than one process may hold (--units-per-client %d)", req.Units, m.cfg.Model.UnitsPerClient)
	}
	if req.GPU != "" {
		if _, err := m.resolveGPU(req.GPU); err != nil {
			return err
		}
	}
	if req.Pool != "" {
		return api.Errorf(api.ErrNotFound, "pool: no pool named %q (no pools are configured)", req.Pool)
	}
	if req.Reservation != "" {
		return api.Errorf(api.ErrNotFound, "reservation: no reservation named %q", req.Reservation)
	}
	if req.Type != "" {
		found := false
		for _, g := range m.gpus {
			found = found || strings.Contains(strings.ToLower(g.dev.Name), strings.ToLower(req.Type))
		}
		if !found {
			return api.Errorf(api.ErrNotFound, "type: no GPU on this node matches %q", req.Type)
		}
	}
	return nil
}

// resolveGPU finds a GPU by index or UUID.
func (m *Manager) resolveGPU(s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n >= 0 && n < len(m.gpus) {
			return n, nil
		}
		return 0, api.Errorf(api.ErrBadRequest, "gpu: no GPU with index %d (this node has %d)", n, len(m.gpus))
	}
	for i, g := range m.gpus {
		if strings.EqualFold(g.dev.UUID, s) {
			return i, nil
		}
	}
	return 0, api.Errorf(api.ErrBadRequest, "gpu: no GPU with UUID %q on this node", s)
}

// bindingFor decides what the lease is bound to and takes hold of the process.
func (m *Manager) bindingFor(peer Peer, req Request) (binding, error) {
	if req.TTL > 0 {
		return binding{ttl: req.TTL}, nil
	}
	pid, admin := peer.PID, peer.Admin || peer.UID == 0
	var p *procwatch.Process
	var st uint64
	var err error
	switch {
	case req.PID != 0 && admin:
		pid = req.PID
		p, st, err = procwatch.Open(pid, 0)
	case req.PID != 0:
		pid = req.PID
		p, st, err = procwatch.OpenOwned(pid, peer.UID)
	case peer.PIDFD != nil:
		p, st, err = procwatch.Adopt(peer.PIDFD, pid)
	default:
		// Without SO_PEERPIDFD the pid may name another process than the
		// one that connected; it must at least be the caller's user's.
		p, st, err = procwatch.OpenOwned(pid, peer.UID)
	}
	if err != nil {
		return binding{}, pidError(pid, req.PID != 0, admin, err)
	}
	return binding{proc: p, pid: pid, startTime: st}, nil
}

func (b binding) close() {
	if b.proc != nil {
		b.proc.Close()
	}
}

// shortageLocked says what was asked and what is free, for insufficient_units.
func (m *Manager) shortageLocked(req Request) string {
	free := 0
	for _, g := range m.gpus {
		for _, s := range g.slots {
			if s.state == slotFree {
				free++
			}
		}
	}
	return fmt.Sprintf("no GPU can take %d unit(s) now (%d free on the node)", req.Units, free)
}

// tryGrantLocked places and grants req, or says why it cannot now.
func (m *Manager) tryGrantLocked(peer Peer, req Request, bind binding) (*lease, error) {
	cond := m.conditions()
	if cond != nil && cond.Draining {
		return nil, api.Errorf(api.ErrUnavailable, "the node is draining: no new leases")
	}
	for {
		c, why := m.placeLocked(peer, req, cond)
		if why != "" {
			return nil, api.Errorf(api.ErrInsufficientUnits, "%s", why)
		}
		units := m.freeUnitsLocked(c.GPU, c.Instance, req.Units)
		taken := false
		for n, u := range units {
			if err := m.createFIFOLocked(c.GPU, u); err != nil {
				// An offline claimer was first: undo, count its claim, and place again.
				for _, v := range units[:n] {
					m.removeFIFOLocked(c.GPU, v)
				}
				if !errors.Is(err, ledger.ErrTaken) {
					return nil, err
				}
				m.applyLocked(c.GPU, u, true)
				taken = true
				break
			}
		}
		if taken {
			continue
		}
		l := m.newLease(peer, req, bind, c, units)
		for _, u := range units {
			s := &m.gpus[c.GPU].slots[u]
			s.state, s.lease = slotLeased, l
		}
		m.leases[l.ID] = l
		e := l.entry()
		if err := m.recordLocked(record{Op: opLease, Entry: &e}); err != nil {
			// The binding stays its caller's (Acquire, or a waiter that may be
			// served later): dropping the lease must not close its pidfd.
			l.proc = nil
			m.dropLocked(l)
			return nil, fmt.Errorf("cannot record the lease: %w", err)
		}
		m.armLocked(l)
		m.granted++
		m.leaseLineLocked("lease granted", slog.String("lease", l.ID), slog.Int("gpu", c.GPU), slog.Int("instance", c.Instance),
			slog.Any("units", units), slog.Uint64("uid", uint64(peer.UID)), slog.Int("pid", l.Owner.PID), slog.String("ttl", l.TTL))
		return l, nil
	}
}

func (m *Manager) conditions() *Conditions {
	if m.cfg.Conditions == nil {
		return nil
	}
	return m.cfg.Conditions()
}

// placeLocked filters the instances that can take req and lets the policy
// choose; why says what kept every GPU out when none can.
func (m *Manager) placeLocked(peer Peer, req Request, cond *Conditions) (placement.Candidate, string) {
	want := -1
	if req.GPU != "" {
		want, _ = m.resolveGPU(req.GPU)
	}
	var cands []placement.Candidate
	var reasons []string
	for gi, g := range m.gpus {
		if want >= 0 && gi != want {
			continue
		}
		if req.Type != "" && !strings.Contains(strings.ToLower(g.dev.Name), strings.ToLower(req.Type)) {
			continue
		}
		var gc *GPUCondition
		if cond != nil && gi < len(cond.GPUs) {
			gc = &cond.GPUs[gi]
		}
		if gc != nil && !gc.Eligible {
			reasons = append(reasons, fmt.Sprintf("GPU %d %s", gi, gc.Why))
			continue
		}
		if req.MemoryMiB > 0 {
			free := g.dev.MemoryTotalMiB
			if gc != nil {
				free = gc.MemoryFreeMiB
			}
			if req.MemoryMiB > free {
				reasons = append(reasons, fmt.Sprintf("GPU %d has %d MiB free", gi, free))
				continue
			}
		}
		gpuFree := 0
		for _, s := range g.slots {
			if s.state == slotFree {
				gpuFree++
			}
		}
		for k := 0; k < m.cfg.Model.InstancesPerGPU; k++ {
			if gc != nil && k < len(gc.InstanceUp) && !gc.InstanceUp[k] {
				continue
			}
			free, clients := m.instanceLoadLocked(gi, k)
			if clients >= m.cfg.Model.ClientsPerInstance || free < req.Units {
				continue
			}
			if m.cfg.MPS && m.otherUserLocked(gi, k, peer.UID, gc) {
				reasons = append(reasons, fmt.Sprintf("GPU %d instance %d serves another user's MPS clients", gi, k))
				continue
			}
			cands = append(cands, placement.Candidate{GPU: gi, Instance: k, Free: free, GPUFree: gpuFree})
		}
	}
	c, ok := m.cfg.Policy.Choose(cands)
	if !ok {
		msg := m.shortageLocked(req)
		if len(reasons) > 0 {
			msg += "; " + strings.Join(reasons, "; ")
		}
		return c, msg
	}
	return c, ""
}

// otherUserLocked reports whether instance k of GPU g serves a user other than
// uid: through its leases, its offline claims, or its live MPS server.
func (m *Manager) otherUserLocked(g, k int, uid uint32, gc *GPUCondition) bool {
	if gc != nil && k < len(gc.ServerUID) && gc.ServerUID[k] != nil && *gc.ServerUID[k] != uid {
		return true
	}
	start, n := m.cfg.Model.InstanceRange(k)
	for _, s := range m.gpus[g].slots[start : start+n] {
		if s.state == slotLeased && s.lease.Owner.UID != uid || s.state == slotOffline && s.uid != uid {
			return true
		}
	}
	return false
}

// instanceLoadLocked returns instance k's free units and its clients: one per
// lease, and one per offline unit since an offline claim's process is unknown.
func (m *Manager) instanceLoadLocked(g, k int) (free, clients int) {
	var seen map[*lease]bool
	start, n := m.cfg.Model.InstanceRange(k)
	for _, s := range m.gpus[g].slots[start : start+n] {
		switch s.state {
		case slotFree:
			free++
		case slotOffline:
			clients++
		case slotLeased:
			if seen == nil {
				seen = map[*lease]bool{}
			}
			if !seen[s.lease] {
				seen[s.lease] = true
				clients++
			}
		}
	}
	return free, clients
}

func (m *Manager) freeUnitsLocked(g, k, n int) []int {
	var out []int
	start, cnt := m.cfg.Model.InstanceRange(k)
	for u := start; u < start+cnt; u++ {
		if m.gpus[g].slots[u].state == slotFree {
			out = append(out, u)
			if len(out) == n {
				break
			}
		}
	}
	return out
}

func (m *Manager) newLease(peer Peer, req Request, bind binding, c placement.Candidate, units []int) *lease {
	dev := m.gpus[c.GPU].dev
	now := m.cfg.Now().UTC()
	l := &lease{Lease: api.Lease{
		ID:          newID(),
		GPU:         api.LeaseGPU{Index: c.GPU, UUID: dev.UUID},
		Instance:    c.Instance,
		Units:       units,
		Owner:       api.Owner{UID: peer.UID, GID: peer.GID, PID: bind.pid},
		Created:     now,
		Reservation: req.Reservation,
		Task:        req.Task,
		Labels:      req.Labels,
		MemoryMiB:   req.MemoryMiB,
	}, startTime: bind.startTime, proc: bind.proc, ttl: bind.ttl}
	if bind.ttl > 0 {
		l.deadline = now.Add(bind.ttl)
		exp := l.deadline
		l.Expires = &exp
		l.TTL = bind.ttl.String()
	}
	l.Env = m.envFor(c.GPU, c.Instance, len(units), req.MemoryMiB)
	l.encode()
	return l
}

// encode makes l.json from l.Lease; call it after every change of l.Lease.
func (l *lease) encode() {
	b, err := json.Marshal(l.Lease)
	if err != nil {
		// A lease holds only strings, numbers, times and maps of strings.
		panic("gpulet: cannot encode lease: " + err.Error())
	}
	l.json = b
}

// envFor is the environment of a lease of n units on instance k of GPU g.
func (m *Manager) envFor(g, k, n int, memMiB uint64) map[string]string {
	dev := m.gpus[g].dev
	env := map[string]string{
		"CUDA_VISIBLE_DEVICES":              dev.UUID,
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": strconv.Itoa(m.cfg.Model.ThreadPercentage(n)),
	}
	for k, v := range m.cfg.InstanceEnv(g, k) {
		env[k] = v
	}
	if m.cfg.MPS {
		if memMiB == 0 {
			memMiB = m.cfg.Model.MemoryShareMiB(n, dev.MemoryTotalMiB)
		}
		env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = fmt.Sprintf("0=%dM", memMiB)
	}
	return env
}

// armLocked starts what ends the lease: its process's exit or its deadline.
func (m *Manager) armLocked(l *lease) {
	if l.proc != nil {
		p, id := l.proc, l.ID
		go func() {
			if p.Wait() == nil {
				m.end(id, "process exited")
			}
		}()
		return
	}
	m.scheduleExpiryLocked(l)
}

func (m *Manager) scheduleExpiryLocked(l *lease) {
	if l.timer != nil {
		l.timer.Stop()
	}
	id := l.ID
	l.timer = time.AfterFunc(l.deadline.Sub(m.cfg.Now()), func() { m.expire(id) })
}

func (m *Manager) expire(id string) {
	if !m.lockOpen() {
		return
	}
	l, ok := m.leases[id]
	if ok && m.cfg.Now().Before(l.deadline) {
		// Renewed meanwhile, or the wall clock stepped back since the timer
		// was armed: arm it again for the deadline as it stands.
		m.scheduleExpiryLocked(l)
	}
	if !ok || m.cfg.Now().Before(l.deadline) {
		m.unlock()
		return
	}
	m.dropAndRecordLocked(l, "ttl expired")
	m.unlock()
	m.cfg.OnChange()
}

// end ends lease id for reason; unknown ids are ignored.
func (m *Manager) end(id, reason string) {
	if !m.lockOpen() {
		return
	}
	l, ok := m.leases[id]
	if ok {
		m.dropAndRecordLocked(l, reason)
	}
	m.unlock()
	if ok {
		m.cfg.OnChange()
	}
}

func (m *Manager) dropAndRecordLocked(l *lease, reason string) {
	m.dropLocked(l)
	if err := m.recordLocked(record{Op: opEnd, ID: l.ID}); err != nil {
		m.log.Error("cannot write lease journal", "err", err)
	}
	m.ended++
	m.leaseLineLocked("lease ended", slog.String("lease", l.ID), slog.String("reason", reason))
	m.serveWaitersLocked()
}

// dropLocked removes a lease from the table and the ledger.
func (m *Manager) dropLocked(l *lease) {
	delete(m.leases, l.ID)
	for _, u := range l.Units {
		if s := &m.gpus[l.GPU.Index].slots[u]; s.lease == l {
			*s = slot{own: s.own}
		}
	}
	m.removeFIFOs(l)
	if l.proc != nil {
		l.proc.Close()
	}
	if l.timer != nil {
		l.timer.Stop()
	}
}

func (m *Manager) removeFIFOs(l *lease) {
	for _, u := range l.Units {
		if err := m.removeFIFOLocked(l.GPU.Index, u); err != nil {
			m.log.Error("cannot remove pipe file", "lease", l.ID, "err", err)
		}
	}
}

// createFIFOLocked makes the FIFO of unit u of GPU g and counts the watch
// event that this causes as the daemon's own.
func (m *Manager) createFIFOLocked(g, u int) error {
	err := m.cfg.Ledger.Create(g, u)
	if err == nil {
		m.gpus[g].slots[u].own++
	}
	return err
}

// removeFIFOLocked removes the FIFO of unit u of GPU g, counting the watch
// event of a removal as the daemon's own.
func (m *Manager) removeFIFOLocked(g, u int) error {
	removed, err := m.cfg.Ledger.Remove(g, u)
	if removed {
		m.gpus[g].slots[u].own++
	}
	return err
}

// serveWaitersLocked grants waiting requests, oldest first, while they fit.
func (m *Manager) serveWaitersLocked() {
	for i := 0; i < len(m.waiters); {
		w := m.waiters[i]
		l, err := m.tryGrantLocked(w.peer, w.req, w.bind)
		if err != nil {
			i++
			continue
		}
		m.waiters = slices.Delete(m.waiters, i, i+1)
		m.eventChanged = true
		g := l.grant()
		w.done <- &g
	}
}

func (m *Manager) visible(peer Peer, l *lease) bool {
	return peer.Admin || peer.UID == 0 || peer.UID == l.Owner.UID
}

// Get returns lease id if peer may see it.
func (m *Manager) Get(peer Peer, id string) (api.Lease, error) {
	m.mu.Lock()
	defer m.unlock()
	l, ok := m.leases[id]
	if !ok || !m.visible(peer, l) {
		return api.Lease{}, api.Errorf(api.ErrNotFound, "no lease %q", id)
	}
	return l.Lease, nil
}

// List returns the leases peer may see, by id.
func (m *Manager) List(peer Peer) []api.Lease {
	m.mu.Lock()
	defer m.unlock()
	out := []api.Lease{}
	for _, l := range m.leases {
		if m.visible(peer, l) {
			out = append(out, l.Lease)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Release ends lease id for peer.
func (m *Manager) Release(peer Peer, id string) error {
	if !m.lockOpen() {
		return api.Errorf(api.ErrUnavailable, "gpuletd is stopping")
	}
	l, ok := m.leases[id]
	if !ok || !m.visible(peer, l) {
		m.unlock()
		return api.Errorf(api.ErrNotFound, "no lease %q", id)
	}
	m.dropAndRecordLocked(l, "released")
	m.unlock()
	m.cfg.OnChange()
	return nil
}

// Renew extends a time-bound lease by its ttl from now.
func (m *Manager) Renew(peer Peer, id string) (api.Lease, error) {
	if !m.lockOpen() {
		return api.Lease{}, api.Errorf(api.ErrUnavailable, "gpuletd is stopping")
	}
	l, ok := m.leases[id]
	if !ok || !m.visible(peer, l) {
		m.unlock()
		return api.Lease{}, api.Errorf(api.ErrNotFound, "no lease %q", id)
	}
	if l.ttl == 0 {
		m.unlock()
		return api.Lease{}, api.Errorf(api.ErrBadRequest, "lease %s is bound to process %d, not to a ttl: it needs no renewal", id, l.Owner.PID)
	}
	l.deadline = m.cfg.Now().UTC().Add(l.ttl)
	exp := l.deadline
	l.Expires = &exp
	l.encode()
	if err := m.recordLocked(record{Op: opRenew, ID: l.ID, Deadline: &exp}); err != nil {
		m.log.Error("cannot write lease journal", "err", err)
	}
	m.scheduleExpiryLocked(l)
	out := l.Lease
	m.unlock()
	m.cfg.OnChange()
	return out, nil
}

// GPUView is one GPU's units as the snapshot shows them.
type GPUView struct {
	Used, Offline int
	Instances     []InstanceView
}

// InstanceView is one instance's load.
type InstanceView struct {
	Clients int
	UID     *uint32
}

// View is the table at one moment.
type View struct {
	GPUs   []GPUView
	Leases []api.Lease
	// Granted and Ended count leases since the Manager was made.
	Granted, Ended uint64
}

// View copies the table for a snapshot.
func (m *Manager) View() View {
	m.mu.Lock()
	defer m.unlock()
	v := View{GPUs: make([]GPUView, len(m.gpus)), Leases: make([]api.Lease, 0, len(m.leases)), Granted: m.granted, Ended: m.ended}
	for gi, g := range m.gpus {
		gv := &v.GPUs[gi]
		for _, s := range g.slots {
			switch s.state {
			case slotLeased:
				gv.Used++
			case slotOffline:
				gv.Used++
				gv.Offline++
			}
		}
		for k := 0; k < m.cfg.Model.InstancesPerGPU; k++ {
			_, clients := m.instanceLoadLocked(gi, k)
			iv := InstanceView{Clients: clients}
			start, n := m.cfg.Model.InstanceRange(k)
			for _, s := range g.slots[start : start+n] {
				if s.state == slotLeased {
					uid := s.lease.Owner.UID
					iv.UID = &uid
					break
				}
			}
			gv.Instances = append(gv.Instances, iv)
		}
	}
	for _, l := range m.leases {
		v.Leases = append(v.Leases, l.Lease)
	}
	sort.Slice(v.Leases, func(i, j int) bool { return v.Leases[i].ID < v.Leases[j].ID })
	return v
}

// recordLocked appends r to the journal, rewriting it when it has grown.
func (m *Manager) recordLocked(r record) error {
	if err := m.journal.append(r); err != nil {
		// A failed or short write may have left part of a line, which would
		// stop every later replay there: write the journal anew from the
		// table, which already holds this change.
		m.log.Error("lease journal append failed; rewriting it", "err", err)
		return m.journal.rewrite(m.entriesLocked())
	}
	if m.journal.due(len(m.leases)) {
		if err := m.journal.rewrite(m.entriesLocked()); err != nil {
			m.log.Error("cannot rewrite lease journal", "err", err)
		}
	}
	return nil
}

// entry is what the journal keeps of a lease.
func (l *lease) entry() journalEntry {
	e := journalEntry{Lease: l.Lease, StartTime: l.startTime, leaseJSON: l.json}
	if l.ttl > 0 {
		d := l.deadline
		e.Deadline = &d
		e.TTLNanos = int64(l.ttl)
	}
	return e
}

// entriesLocked lists every live lease's journal entry, by id.
func (m *Manager) entriesLocked() []journalEntry {
	out := make([]journalEntry, 0, len(m.leases))
	for _, l := range m.leases {
		out = append(out, l.entry())
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Lease.ID < out[b].Lease.ID })
	return out
}

// Close stops granting: waiting requests get unavailable. Live leases stay in
// the journal and the ledger, to be taken back by the next start.
func (m *Manager) Close() error {
	m.mu.Lock()
	defer m.unlock()
	m.closed = true
	m.journal.close()
	for _, w := range m.waiters {
		w.bind.close()
		w.done <- nil
	}
	m.waiters = nil
	for _, l := range m.leases {
		if l.proc != nil {
			l.proc.Close()
		}
		if l.timer != nil {
			l.timer.Stop()
		}
	}
	return nil
}
