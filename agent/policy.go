package agent

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/gpulet/gpulet/agent/lease"
	"github.com/gpulet/gpulet/agent/profiles"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/config"
	"github.com/gpulet/gpulet/identity"
	"github.com/gpulet/gpulet/placement"
)

// loadConfig reads, checks and resolves the --config file against this
// node's GPUs and the user database; nil rules and no error without
// --config.
func (a *Agent) loadConfig() (*config.Rules, error) {
	if a.cfg.ConfigPath == "" {
		return nil, nil
	}
	f, err := config.Load(a.cfg.ConfigPath)
	if err != nil {
		return nil, err
	}
	gpus := make([]config.GPURef, len(a.devs))
	names := make([]string, len(a.devs))
	for i, d := range a.devs {
		gpus[i] = config.GPURef{Index: d.Index, UUID: d.UUID}
		names[i] = d.Name
	}
	r, err := f.Resolve(gpus, identity.SystemDirectory{})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", a.cfg.ConfigPath, err)
	}
	for _, skipped := range r.Skipped {
		a.log.Warn("config rule skipped: a name could not be resolved", "config", a.cfg.ConfigPath, "rule", skipped)
	}
	if missing := f.ModelsNotIn(names); len(missing) > 0 {
		a.log.Warn("task profiles name GPU models this node has none of (a typo matches no GPU)", "config", a.cfg.ConfigPath, "models", missing, "node_models", names)
	}
	return r, nil
}

// engineFor is the placement engine of r: --policy with r's pools and
// score weights.
func (a *Agent) engineFor(r *config.Rules) *placement.Engine {
	e := placement.New(a.cfg.Policy)
	if r != nil {
		e = e.WithPools(r.Pools).WithWeights(r.ScoreWeights())
	}
	if a.mix != nil {
		e = e.WithMix(a.mix.Mix())
	}
	return e
}

// Learning the request mix of the frag policy: the last nodeMixWindow
// requests are remembered (older ones weigh less), the nodeMixShapes most
// frequent shapes weighed, and a new mix put in force every nodeMixEvery
// requests, so that the engine is replaced seldom.
const (
	nodeMixWindow = 1024
	nodeMixShapes = 16
	nodeMixEvery  = 32
)

// observe counts a lease granted to uid in the frag policy's mix, within
// that user's share (placement.UserShare), and puts a new engine in force
// when the mix changed. Nothing happens under other policies.
func (a *Agent) observe(uid uint32, req lease.Request) {
	if a.mix == nil {
		return
	}
	before := a.mix.Mix()
	a.mix.ObserveBy("uid "+strconv.FormatUint(uint64(uid), 10), placement.Request{Units: req.Units, GPUs: req.GPUs, Type: req.Type, MemoryMiB: req.MemoryMiB})
	if a.mix.Mix() != before {
		a.engineMu.Lock()
		defer a.engineMu.Unlock()
		a.leases.SetEngine(a.engineFor(a.rules.Load()))
	}
}

// applyRules puts r in force: a new placement engine (pools, score
// weights), the quotas and the profiles' starting figures. Decisions under
// way finish with the old engine.
func (a *Agent) applyRules(r *config.Rules) {
	a.engineMu.Lock()
	e := a.engineFor(r)
	var quotas *lease.Quotas
	var seeds map[string]map[string]time.Duration
	if r != nil {
		quotas = lease.NewQuotas(r.Quotas)
		seeds = r.Profiles
	}
	a.rules.Store(r)
	a.leases.SetRules(e, quotas)
	a.engineMu.Unlock()
	a.leases.Reservations().SetPriorityCeiling(r.UserPriorityCeiling())
	a.setLedgerAccess(r)
	a.profiles.Seed(seeds)
	a.changed()
}

// reloadOnHangup reloads the config at each SIGHUP on hangup until ctx
// ends; reloads run one at a time.
func (a *Agent) reloadOnHangup(ctx context.Context, hangup <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hangup:
			a.reload()
		}
	}
}

// reload is SIGHUP: the config file read again and, if it is sound, put in
// force; a bad file is logged and the config in force stays.
func (a *Agent) reload() {
	if a.cfg.ConfigPath == "" {
		a.log.Info("SIGHUP: nothing to reload, gpuletd runs without --config")
		return
	}
	r, err := a.loadConfig()
	if err != nil {
		a.log.Error("SIGHUP: config not reloaded; the config in force stays", "err", err)
		// Shown in the snapshot and gpulet status too: a reload that failed
		// in the log alone looks like one that worked.
		why := fmt.Sprintf("the reload of %s at %s failed, and the config read before stays in force: %v", a.cfg.ConfigPath, time.Now().Format(time.RFC3339), err)
		a.reloadFailed.Store(&why)
		a.changed()
		return
	}
	a.reloadFailed.Store(nil)
	a.applyRules(r)
	a.log.Info("SIGHUP: config reloaded", "config", a.cfg.ConfigPath, "pools", len(r.Pools), "quotas", len(r.Quotas), "profiles", len(r.Profiles))
}

// taskRan records a measured run of a task (the lease manager's TaskRan).
func (a *Agent) taskRan(task, model string, uid uint32, d time.Duration) {
	a.profiles.Record(task, model, uid, d)
}

// Explain is the dry run of a lease.
func (a *Agent) Explain(peer identity.Peer, req lease.Request) (api.Placement, error) {
	return a.leases.Explain(peer, req)
}

// Profiles is the task–engine affinity table as peer sees it: its own
// measured runs over the config's figures, and every user's for admins.
func (a *Agent) Profiles(peer identity.Peer) api.ProfileList {
	return a.profiles.Table().API(peer.UID, peer.Admin)
}

// Pools lists the configured pools with their free units now.
func (a *Agent) Pools(peer identity.Peer) api.PoolList {
	out := api.PoolList{Pools: []api.Pool{}}
	r := a.rules.Load()
	if r == nil {
		return out
	}
	var free []int
	if p := a.store.Load(); p != nil {
		for _, g := range p.Snapshot.GPUs {
			free = append(free, g.UnitsFree)
		}
	}
	out.SkippedRules = r.Skipped
	gids := peer.GIDs()
	for _, p := range r.Pools {
		ap := api.Pool{Name: p.Name, GPUs: p.GPUs, Allowed: peer.Admin || p.Allows(peer.UID, gids)}
		for _, g := range p.GPUs {
			if g < len(free) {
				ap.UnitsFree += free[g]
			}
		}
		out.Pools = append(out.Pools, ap)
	}
	return out
}

// Quotas lists the quotas that apply to peer and what it holds against each.
func (a *Agent) Quotas(peer identity.Peer) api.QuotaList {
	out := api.QuotaList{Admin: peer.Admin, Quotas: []api.QuotaUsage{}}
	for _, q := range a.leases.QuotaUse(peer) {
		out.Quotas = append(out.Quotas, api.QuotaUsage{Quota: q.Key, Limit: q.Limit, Held: q.Held, Reserved: q.Reserved})
	}
	return out
}

// openProfiles opens the task profiles kept in the state dir.
func (a *Agent) openProfiles() error {
	s, err := profiles.Open(a.cfg.StateDir, a.log)
	if err != nil {
		return err
	}
	a.profiles = s
	return nil
}
