package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/gpulet/gpulet/internal/statefile"
	"github.com/gpulet/gpulet/pipefile"
	"github.com/gpulet/gpulet/placement"
)

// usersWriteGap is the least time between two writes of users.json: under a
// storm of leases it is written a few dozen times a second at most, and an
// offline claimer is at most this late to see a new lease's user.
const usersWriteGap = 20 * time.Millisecond

// publishUsers keeps users.json (pipefile.UsersFile) true to whom each MPS
// instance serves, for offline claimers, who cannot ask gpuletd: it writes it
// when a change or a sample alters it, and removes it when ctx ends, since
// the MPS servers go with gpuletd. Without MPS anyone shares an instance with
// anyone, and there is no file.
func (a *Agent) publishUsers(ctx context.Context, every time.Duration) {
	path := filepath.Join(a.ledger.Root(), pipefile.UsersFile)
	defer os.Remove(path)
	if !a.mpsOn {
		return
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var written []byte
	failing := false
	for {
		changed := a.store.Changed()
		b, err := pipefile.EncodeUsers(a.instanceUsers())
		if err == nil && !bytes.Equal(b, written) {
			err = statefile.Replace(path, b, 0o644)
			written = b
			if err != nil {
				// Better no file than a stale one (a full disk): claimers
				// then go by the owners of the claims alone.
				os.Remove(path)
				written = nil
			}
		}
		if (err != nil) != failing {
			failing = err != nil
			if failing {
				a.log.Warn("cannot write users.json, which offline claimers read to keep off instances that serve another user", "err", err)
			} else {
				a.log.Info("users.json written again")
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-tick.C:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(usersWriteGap):
		}
	}
}

// instanceUsers is whom each instance serves, as the placement engine sees
// it: the owners of its leases and offline claims, as the lease engine last
// published them, but for those whose holds there are surplus
// (placement.Surplus), and the user of its live MPS server, as last sampled.
func (a *Agent) instanceUsers() pipefile.Users {
	u := pipefile.Users{PID: os.Getpid(), GPUs: make(map[string][][]uint32, len(a.devs))}
	v := a.leases.View()
	cond := a.conditions.Load()
	hs := make([][]placement.Holding, len(v.GPUs))
	for g, gv := range v.GPUs {
		hs[g] = make([]placement.Holding, len(gv.Instances))
		for k, iv := range gv.Instances {
			hs[g][k] = placement.Holding{Size: iv.Size, Holds: iv.Holds}
		}
	}
	surplus := placement.Surplus(hs)
	for g, d := range a.devs {
		ins := make([][]uint32, len(v.GPUs[g].Instances))
		for k, iv := range v.GPUs[g].Instances {
			yield := surplus[placement.Slot{GPU: g, Instance: k}]
			if len(yield) > 0 {
				if u.Surplus == nil {
					u.Surplus = map[string][][]uint32{}
				}
				if u.Surplus[d.UUID] == nil {
					u.Surplus[d.UUID] = make([][]uint32, len(v.GPUs[g].Instances))
				}
				u.Surplus[d.UUID][k] = yield
			}
			uids := slices.Clone(iv.Users)
			if cond != nil && g < len(cond.GPUs) && k < len(cond.GPUs[g].ServerUID) && cond.GPUs[g].ServerUID[k] != nil {
				uids = append(uids, *cond.GPUs[g].ServerUID[k])
			}
			uids = slices.DeleteFunc(uids, func(uid uint32) bool { return slices.Contains(yield, uid) })
			slices.Sort(uids)
			ins[k] = slices.Compact(uids)
		}
		u.GPUs[d.UUID] = ins
	}
	return u
}
