// Package lease is the lease engine. Its table (Manager) owns the units of
// every GPU (free, leased, claimed offline, set aside), grants and ends
// leases, binds them to what ends them (a process, a ttl), keeps the journal
// (package journal: its format, file and replay) and reconciles with the
// pipe-file ledger, all under one lock; it asks the placement engine where a
// lease goes, then commits. Workflow reservations, Slurm jobs and Kubernetes
// pods are features on the table (feature.go): each owns its state and is
// called only through the table's hooks, so that a new kind of lease lands as
// a feature, not inside the table. Everyone else reads the table through the
// immutable View it publishes on every change, without taking its lock.
package lease

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/journal"
	"github.com/gpulet/gpulet/agent/ledger"
	"github.com/gpulet/gpulet/agent/profiles"
	"github.com/gpulet/gpulet/agent/units"
	accounting "github.com/gpulet/gpulet/agent/usage"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/internal/clock"
	"github.com/gpulet/gpulet/internal/ratelog"
	"github.com/gpulet/gpulet/placement"
)

// Conditions is what the agent knows of the GPUs beyond units: the manager
// places only where it allows.
type Conditions struct {
	Draining bool
	GPUs     []GPUCondition
}

// GPUCondition is one GPU's conditions.
type GPUCondition struct {
	// Unusable says why the GPU takes no new leases (failed, too busy);
	// empty when it may.
	Unusable      string
	MemoryFreeMiB uint64
	// Accounted says accounting attributed the GPU's processes, and
	// OutsideMiB is what it found used by processes that are no lease's,
	// claim's or MPS server's: memory nothing holds that is not free
	// either (memory.go).
	Accounted  bool
	OutsideMiB uint64
	// InstanceDown says per instance why it takes no new leases; empty when
	// it may.
	InstanceDown []string
	// ServerUID is, per instance, the uid of its live MPS server (nil: none).
	ServerUID []*uint32
}

// Config wires a Manager.
type Config struct {
	Model   units.Model
	Devices []inventory.Device
	Ledger  *ledger.Ledger
	// JournalPath is where live leases are recorded (<run-dir>/leases.journal).
	JournalPath string
	// Policy is the placement engine's policy; SetRules swaps the engine
	// (a config reload).
	Policy placement.Policy
	// Engine, when set, is the placement engine from the start (pools and
	// weights of the config in force), Policy left aside: what New restores
	// (pending reservations admitted at start) is placed with it.
	Engine *placement.Engine
	// Conditions are the agent's conditions at start (nil: none yet);
	// SetConditions brings each new set.
	Conditions *Conditions
	// InstanceEnv are the MPS variables (pipe and log folders) of each
	// instance, by GPU index and instance: fixed once the MPS daemons are set
	// up. Nil when MPS is off.
	InstanceEnv [][]map[string]string
	// MPS adds the MPS-only variables (pinned memory limit) to leases, and
	// keeps users apart: an MPS server runs as one user and clients of another
	// user queue behind it, so a lease never goes to an instance whose clients
	// belong to another uid.
	MPS    bool
	Logger *slog.Logger
	// Clock runs ttls, reclaim graces and the polls of Slurm jobs; the real
	// clock when nil.
	Clock clock.Clock
	// Processes opens the processes that leases are bound to; the real pidfd
	// watcher when nil.
	Processes Processes
	// MaxWaitersPerUID caps the requests one uid (root aside) may have
	// waiting for units at once; 0: no cap.
	MaxWaitersPerUID int
	// Profiles is the task–engine affinity table (nil: no preference): a
	// request with a task prefers the GPU models it runs fastest on for its
	// uid, as in the table the store last published. Its read takes no
	// lock, and the store cannot call the Manager: the Manager imports it.
	Profiles *profiles.Store
	// ReservationsPath is the file that keeps workflow reservations
	// (<state-dir>/reservations.json); empty: they live in memory only.
	ReservationsPath string
	// ReclaimGrace is how long a reclaimed borrower has between SIGTERM and
	// SIGKILL.
	ReclaimGrace time.Duration
	// Accounts resolves the names of share members; the system's when nil.
	Accounts identity.Directory
	// Usage is the accounting (nil: off): a lease's end records and logs the
	// most GPU memory its processes used, as the accountant's last round
	// measured it, as sacct keeps a job's peak. Its read takes no lock, and
	// the accountant cannot call the Manager: the Manager imports it.
	Usage *accounting.Accountant
	// Slurm says where Slurm's cgroups are, for leases of kind slurm.
	Slurm SlurmConfig

	// The agent hears from the Manager only through these two, never called
	// under the Manager's lock: they may call the Manager.

	// OnChange is called after every change of the table, once its View is
	// published, on the goroutine that made the change and before the call
	// that made it returns: no answer goes out before the snapshot can show
	// it. Nil: nobody listens.
	OnChange func()
	// TaskRan is told how long a lease of uid with a task ran on a GPU
	// model, when the lease ended because its process exited, on the
	// goroutine that saw the exit: the measured runs task–engine affinity
	// learns from. Nil: nobody listens.
	TaskRan func(task, model string, uid uint32, d time.Duration)
}

// Manager owns the unit table.
type Manager struct {
	cfg    Config
	log    *slog.Logger
	clock  clock.Clock
	engine atomic.Pointer[placement.Engine]
	// view is the table as last published; read without mu.
	view atomic.Pointer[View]
	// conditions are the agent's, as last set; read without mu.
	conditions atomic.Pointer[Conditions]
	// claimLines bounds the lines offline claimers can cause (stale claims
	// removed): any member of the socket group can make many.
	claimLines *ratelog.Limiter

	// mu guards every field below: the unit table (gpus, with its slots and
	// dirty marks), the live leases (leases, with their bindings' timers and
	// processes) and the units each process holds (held), the units held
	// against quotas (quotaUse) and the quotas in force, the waiters, the
	// journal and every write to it, the reservations and every write of
	// their file, the log lines queued under it and the line budget, the
	// counters, the version of the view, and closed.
	// Helpers that need it held end in Locked.
	mu sync.Mutex
	// gpus is the unit table, by GPU index.
	gpus []*gpuTable
	// leases are the live leases by id.
	leases map[string]*lease
	// expiries are the ttl leases by deadline (ttl.go).
	expiries expiryQueue
	// envs are the environments leases share (env.go).
	envs map[envKey]map[string]string
	// held counts the units of process-bound leases per process: one process
	// may hold at most M.
	held map[procKey]int
	// quotaUse counts the units held per uid, per group and in all, against
	// quotas (the quotas in force).
	quotaUse quotaUse
	quotas   *Quotas
	// waiters are requests waiting for units, oldest first; waitCap counts
	// them per uid.
	waiters []*waiter
	// holdsBegun is when each user's waiter last began to have freed units
	// held for it (fairness.go).
	holdsBegun map[uint32]time.Time
	waitCap    uidCap
	// journal records live leases.
	journal *journal.File
	// pendingLogs are log lines made under mu, written by unlock once mu is
	// free: a slow log sink must not hold up leasing.
	pendingLogs []pendingLog
	// lines is the budget of per-lease log lines.
	lines lineBudget
	// granted and ended count leases since New.
	granted, ended uint64
	// version counts published views; dirty says the table changed since;
	// told is the version OnChange was last called for.
	version uint64
	dirty   bool
	told    uint64
	// builds numbers the builds of a GPU's view (lease.seen).
	builds uint64
	// node is the placement engine's view of the node; nodeBuilt says which
	// build of each GPU's view it holds, nodeCond which conditions.
	node      *placement.Node
	nodeBuilt []uint64
	nodeCond  *Conditions
	closed    bool

	// fifos makes and removes the FIFOs of leased units; rec records the
	// table's changes in the journal; pub publishes the View.
	fifos fifoKeeper
	rec   journalKeeper
	pub   publisher
	// res is the workflow-reservation feature (its state is under mu too);
	// features are every feature, in the order their hooks run.
	res      *Reservations
	slurm    *SlurmJobs
	features []feature
}

// New builds the Manager, takes back what the journal and the ledger hold, and
// removes what is stale. It does not watch yet: call Watch.
func New(cfg Config) (*Manager, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Processes == nil {
		cfg.Processes = pidfdProcesses{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.OnChange == nil {
		cfg.OnChange = func() {}
	}
	if cfg.TaskRan == nil {
		cfg.TaskRan = func(string, string, uint32, time.Duration) {}
	}
	if cfg.Accounts == nil {
		cfg.Accounts = identity.SystemDirectory{}
	}
	m := &Manager{cfg: cfg, log: cfg.Logger, clock: cfg.Clock, leases: map[string]*lease{}, envs: map[envKey]map[string]string{}, held: map[procKey]int{}, quotaUse: newQuotaUse(), journal: journal.NewFile(cfg.JournalPath)}
	m.fifos, m.rec, m.pub = fifoKeeper{t: m}, journalKeeper{t: m}, publisher{t: m}
	m.expiries.t = m
	m.res = &Reservations{t: m, byName: map[string]*reservation{}}
	m.slurm = &SlurmJobs{t: m, processes: cfg.Processes, slurm: cfg.Slurm}
	m.features = []feature{m.slurm, m.res}
	m.conditions.Store(cfg.Conditions)
	if cfg.Engine == nil {
		cfg.Engine = placement.New(cfg.Policy)
	}
	m.engine.Store(cfg.Engine)
	m.lines = lineBudget{clock: cfg.Clock, info: m.infoLocked}
	m.claimLines = ratelog.New(cfg.Logger, "offline claims", claimLinesPerSecond, cfg.Clock.Now)
	for _, d := range cfg.Devices {
		m.gpus = append(m.gpus, &gpuTable{dev: d, slots: make([]slot, cfg.Model.UnitsPerGPU), dirty: true})
	}
	m.dirty = true
	m.restore()
	// Claims nobody holds go before the daemon serves.
	m.probeOffline()
	return m, nil
}

// claimLinesPerSecond bounds the log lines about offline claims.
const claimLinesPerSecond = 20

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
		m.mu.Unlock()
		return false
	}
	return true
}

// infoLocked queues an info line for unlock to write.
func (m *Manager) infoLocked(msg string, attrs ...slog.Attr) {
	m.pendingLogs = append(m.pendingLogs, pendingLog{msg, attrs})
}

// unlock publishes the view if the table changed, releases mu, writes the
// lines queued under it, and then tells OnChange. The lines go to the handler
// directly, as records without a caller's pc: slog.Logger would walk the stack
// for one on every line, and these lines name their lease instead.
func (m *Manager) unlock() {
	m.pub.publishLocked()
	// A view may have been published under this lock before now (a decision
	// publishes what it decides on), so compare with what was last told.
	changed := m.version != m.told
	m.told = m.version
	logs := m.pendingLogs
	m.pendingLogs = nil
	m.mu.Unlock()
	if len(logs) > 0 {
		ctx, h := context.Background(), m.log.Handler()
		if h.Enabled(ctx, slog.LevelInfo) {
			for _, l := range logs {
				r := slog.NewRecord(time.Now(), slog.LevelInfo, l.msg, 0)
				r.AddAttrs(l.attrs...)
				h.Handle(ctx, r)
			}
		}
	}
	if changed {
		m.cfg.OnChange()
	}
}

// Tick does what the agent does every sample interval: it writes a failed
// journal anew, probes offline claims and says how many lease lines the last
// second left out.
func (m *Manager) Tick() {
	if !m.lockOpen() {
		return
	}
	m.lines.roll()
	m.rec.repairJournalLocked()
	for _, f := range m.features {
		f.tickLocked()
	}
	m.unlock()
	m.probeOffline()
	m.claimLines.Flush()
}

// Close stops granting: waiting requests get unavailable. Live leases stay in
// the journal and the ledger, to be taken back by the next start.
func (m *Manager) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	m.journal.Close()
	for _, w := range m.waiters {
		w.bind.release()
		w.done <- nil
	}
	m.waiters = nil
	for _, l := range m.leases {
		l.bind.release()
	}
	m.expiries.stopLocked()
	return nil
}
