package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/gpulet/gpulet/api"
)

func init() {
	commands["profiles"] = command{"[--json]", "Show the task–engine affinity table as it steers your leases: per task, its run\ntime on each GPU model, fastest first, and how many of your measured runs the figure\nrests on (0: the config file's figure alone). A lease with --task goes to the\nfastest model that has room, then the next. Admins also see every user's measured\nrun times.", 0, 0,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			asJSON := fs.Bool("json", false, "print the table as the API does")
			return func(ctx context.Context, e *env) error {
				p, err := e.c.Profiles(ctx)
				if err != nil {
					return err
				}
				if *asJSON {
					return writeJSON(e.out, p)
				}
				WriteProfiles(e.out, p)
				return nil
			}
		}}
}

// WriteProfiles prints the affinity table as it steers the caller's
// placements, one row per task and model; then, for an admin, every user's
// measured run times.
func WriteProfiles(w io.Writer, p *api.ProfileList) {
	if len(p.Profiles) == 0 {
		fmt.Fprintln(w, "no task profiles: none in the config file, and none of your task leases has ended by its process exiting yet")
	} else {
		t := newTable(w, "TASK", "MODEL", "RUN TIME", "RUNS")
		for _, task := range p.Profiles {
			for _, m := range task.Models {
				t.row(task.Task, m.Model, runTime(m.Seconds), strconv.Itoa(m.Runs))
			}
		}
		t.flush()
	}
	if len(p.Learned) == 0 {
		return
	}
	fmt.Fprintln(w, "\nmeasured run times, per user (each steers only that user's placements):")
	t := newTable(w, "UID", "TASK", "MODEL", "RUN TIME", "RUNS")
	for _, u := range p.Learned {
		for _, task := range u.Profiles {
			for _, m := range task.Models {
				t.row(strconv.FormatUint(uint64(u.UID), 10), task.Task, m.Model, runTime(m.Seconds), strconv.Itoa(m.Runs))
			}
		}
	}
	t.flush()
}

func runTime(seconds float64) string {
	return time.Duration(seconds * float64(time.Second)).Round(time.Millisecond).String()
}

// writeAccess prints the pools and the caller's quota use under the status
// table; nothing when neither is configured.
func writeAccess(w io.Writer, pools *api.PoolList, quotas *api.QuotaList) {
	if len(pools.Pools) > 0 {
		fmt.Fprintln(w)
		t := newTable(w, "POOL", "GPUS", "FREE", "YOU")
		for _, p := range pools.Pools {
			gpus := make([]string, len(p.GPUs))
			for i, g := range p.GPUs {
				gpus[i] = strconv.Itoa(g)
			}
			you := "may not use"
			if p.Allowed {
				you = "may use"
			}
			t.row(p.Name, strings.Join(gpus, ","), strconv.Itoa(p.UnitsFree), you)
		}
		t.flush()
	}
	if len(pools.SkippedRules) > 0 {
		fmt.Fprintln(w, "\nconfig rules skipped (a user or group name did not resolve; gpulet config check FILE):")
		for _, r := range pools.SkippedRules {
			fmt.Fprintln(w, "  "+r)
		}
	}
	switch {
	case quotas.Admin && len(pools.Pools) > 0:
		fmt.Fprintln(w, "\nquotas: none bind you (admin)")
	case len(quotas.Quotas) > 0:
		parts := make([]string, len(quotas.Quotas))
		for i, q := range quotas.Quotas {
			parts[i] = fmt.Sprintf("%s %d/%d", Printable(q.Quota), q.Held, q.Limit)
			if q.Reserved > 0 {
				parts[i] = fmt.Sprintf("%s %d+%d reserved/%d", Printable(q.Quota), q.Held, q.Reserved, q.Limit)
			}
		}
		fmt.Fprintln(w, "\nyour quotas (held/limit):", strings.Join(parts, ", "))
	}
}

// overQuotaNotes are the status lines of the quotas held above their limit.
func overQuotaNotes(over []api.QuotaOver) []string {
	var out []string
	for _, q := range over {
		held := strconv.Itoa(q.Held)
		if q.Reserved > 0 {
			held += fmt.Sprintf(" (+%d reserved)", q.Reserved)
		}
		out = append(out, fmt.Sprintf("quota %s: %s unit(s) held, over its limit of %d (offline claims count too): no new lease for it until back under", q.Quota, held, q.Limit))
	}
	return out
}
