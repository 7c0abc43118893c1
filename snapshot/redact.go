package snapshot

import (
	"sync"

	"github.com/gpulet/gpulet/api"
)

// redacted is the Published that Redacted returns, made on first use.
type redacted struct {
	once sync.Once
	p    *Published
}

// Redacted is p as a reader with no identity on this host may see it (over
// --listen, or pushed to an upstream reached without TLS or credentials):
// the same counts, without who holds them. Fields are emptied or left out,
// never renamed, so that it is still a snapshot of the same schema: no
// offline_by_uid, no instance uid or slurm_jobs, no MPS server's uid or pid,
// no claims and no processes beside gpulet (their counts and memory stay),
// no reservation names, no user or group a quota over its limit names, no
// leases. It is made once per snapshot, on first use.
func (p *Published) Redacted() *Published {
	p.redacted.once.Do(func() {
		p.redacted.p = New(Redact(p.Snapshot), nil, p.render)
	})
	return p.redacted.p
}

// Redact returns a copy of s without the uids of its users, the names of
// its reservations, the users and groups its quotas name, and what a failed
// config reload said; s is not changed.
func Redact(s *api.Snapshot) *api.Snapshot {
	out := *s
	out.GPUs = make([]api.GPU, len(s.GPUs))
	for i, g := range s.GPUs {
		g.OfflineByUID = nil
		// Who claims and what runs beside gpulet go; the counts and the
		// memory stay (units_offline, outside_memory_mib).
		g.Claims, g.OutsideProcesses = nil, nil
		insts := make([]api.Instance, len(g.Instances))
		for k, in := range g.Instances {
			in.UID = nil
			// A Slurm job id names its user to anyone who can ask Slurm:
			// it is a lease's, and leases stay out.
			in.SlurmJobs = nil
			if in.Servers != nil {
				servers := make([]api.MPSServer, len(in.Servers))
				for j, srv := range in.Servers {
					servers[j] = api.MPSServer{Clients: srv.Clients}
				}
				in.Servers = servers
			}
			insts[k] = in
		}
		if g.Instances == nil {
			insts = nil
		}
		g.Instances = insts
		out.GPUs[i] = g
	}
	if s.GPUs == nil {
		out.GPUs = nil
	}
	if s.Reservations != nil {
		out.Reservations = make([]api.ReservationStatus, len(s.Reservations))
		for i, r := range s.Reservations {
			r.Name = ""
			out.Reservations[i] = r
		}
	}
	if s.OverQuota != nil {
		// A quota is named by its user (alice, a uid) or group: who is
		// over it. The node-wide "*" names nobody and stays.
		out.OverQuota = make([]api.QuotaOver, len(s.OverQuota))
		for i, q := range s.OverQuota {
			if q.Quota != "*" {
				q.Quota = ""
			}
			out.OverQuota[i] = q
		}
	}
	if s.ConfigError != "" {
		// The config's problem may quote the users and groups it names.
		out.ConfigError = "the last reload of the config failed"
	}
	return &out
}
