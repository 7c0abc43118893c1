package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
)

// The workflow reservation commands (docs/design.md §12): reserve,
// reservations, advance, unreserve.
func init() {
	commands["reserve"] = command{"NAME --stages N,N,... [--share USER[:W],group:G[:W],...] [--priority N] [--wait] [--json]",
		`Set aside units for a workflow: as many as its largest stage needs, at once. A stage
is a number of units, or its jobs' units joined by '+' (3+1+2 is a stage of 6).
Units a stage does not need are lent to the share group: users, or group:NAME, with
weights (bob:1,carol:2) or, without, in the order listed. You (and admins) draw on
the reservation with gpurun --reservation NAME; gpulet advance NAME starts the next
stage and takes lent units back when it needs them.

With --wait, a reservation that cannot be set aside now waits (pending), ahead of
those of lower priority; units that free meanwhile are held for it.`, 1, 1,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			stages := fs.String("stages", "", "the stages' units in order, e.g. 2,6,6,8 or 2,3+3,8 (required)")
			share := fs.String("share", "", "who may borrow what a stage does not need: USER[:WEIGHT] and group:NAME[:WEIGHT], comma-separated")
			priority := fs.Int("priority", 0, "order among reservations waiting for units: higher first (-1000 to 1000)")
			wait := fs.Bool("wait", false, "wait (pending) when the units cannot be set aside now")
			asJSON := fs.Bool("json", false, "print the reservation as the API answers it")
			return func(ctx context.Context, e *env) error {
				if !fs.Changed("stages") {
					return usageErr("--stages is required, e.g. --stages 2,6,6,8")
				}
				req := api.ReservationRequest{Name: e.args[0], Priority: *priority, Wait: *wait}
				var err error
				// A bad --stages or --share is a usage error (exit 2), as a
				// bad value of any other flag is.
				if req.Stages, err = ParseStages(*stages); err != nil {
					return usageErr(err.Error())
				}
				if req.Share, err = ParseShare(*share); err != nil {
					return usageErr(err.Error())
				}
				r, err := e.c.Reserve(ctx, req)
				if err != nil {
					return err
				}
				if *asJSON {
					return writeJSON(e.out, r)
				}
				if r.State == api.ReservationPending {
					fmt.Fprintf(e.out, "%s is pending: it waits for %d unit(s) (%d held so far); gpulet reservations shows it\n", Printable(r.Name), slices.Max(r.Needs), r.Held)
					return nil
				}
				fmt.Fprintf(e.out, "reserved %s: %d unit(s) set aside; stage 1 of %d needs %d, lends %d\n", Printable(r.Name), r.Reserved, r.Stages, r.Need, r.Lendable)
				return nil
			}
		}}
	commands["reservations"] = command{"[--json]", "List the node's workflow reservations: state, stage, and what each has set aside,\nuses, lends and took back.", 0, 0,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			asJSON := fs.Bool("json", false, `print {"reservations":[...]} as the API does`)
			return func(ctx context.Context, e *env) error {
				rs, err := e.c.Reservations(ctx)
				if err != nil {
					return err
				}
				if *asJSON {
					return writeJSON(e.out, api.ReservationList{Reservations: rs})
				}
				WriteReservations(e.out, rs)
				return nil
			}
		}}
	commands["advance"] = command{"NAME [--json]", "Start the next stage of a reservation (its owner and admins). When the stage needs more\nthan the reservation has unlent, lent units are taken back: their holders get SIGTERM\nand, after gpuletd's --reclaim-grace, SIGKILL. Past the last stage the reservation ends.", 1, 1,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			asJSON := fs.Bool("json", false, "print the reservation as the API answers it")
			return func(ctx context.Context, e *env) error {
				r, err := e.c.Advance(ctx, e.args[0])
				if err != nil {
					return err
				}
				if *asJSON {
					return writeJSON(e.out, r)
				}
				if r.State == api.ReservationEnded {
					fmt.Fprintf(e.out, "%s: past its last stage, it ended; its units went back to the node\n", Printable(r.Name))
					return nil
				}
				fmt.Fprintf(e.out, "%s: stage %d of %d started, needs %d, lends %d", Printable(r.Name), r.Stage+1, r.Stages, r.Need, r.Lendable)
				if r.Reclaimed > 0 {
					fmt.Fprintf(e.out, "; took back %d lent unit(s) (%d still with borrowers that got SIGTERM)", r.Reclaimed, r.Reclaiming)
				}
				fmt.Fprintln(e.out)
				return nil
			}
		}}
	commands["unreserve"] = command{"NAME", "End a reservation (its owner and admins); its units go back to the node. Leases on it\ngo on as they are.", 1, 1,
		func(fs *pflag.FlagSet) func(context.Context, *env) error {
			return func(ctx context.Context, e *env) error {
				if err := e.c.Unreserve(ctx, e.args[0]); err != nil {
					return err
				}
				fmt.Fprintf(e.out, "ended %s; its units went back to the node\n", Printable(e.args[0]))
				return nil
			}
		}}
}

// ParseStages reads --stages: stages separated by ',', each a number of units
// or its jobs' units joined by '+'.
func ParseStages(s string) ([]api.Stage, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("--stages is empty: give each stage's units in order, e.g. 2,6,6,8")
	}
	var out []api.Stage
	for i, item := range strings.Split(s, ",") {
		jobs := strings.Split(item, "+")
		var units []int
		for _, j := range jobs {
			n, err := strconv.Atoi(strings.TrimSpace(j))
			if err != nil || n < 1 {
				return nil, fmt.Errorf("--stages: stage %d (%q): each stage or job is a whole number of units, at least 1", i+1, item)
			}
			units = append(units, n)
		}
		if len(units) == 1 {
			out = append(out, api.Stage{Units: units[0]})
		} else {
			out = append(out, api.Stage{Jobs: units})
		}
	}
	return out, nil
}

// ParseShare reads --share: members separated by ',', each USER[:WEIGHT] or
// group:NAME[:WEIGHT].
func ParseShare(s string) ([]api.ShareMember, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []api.ShareMember
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		prefix, rest := "", item
		if strings.HasPrefix(item, identity.GroupPrefix) {
			prefix, rest = identity.GroupPrefix, item[len(identity.GroupPrefix):]
		}
		m := api.ShareMember{User: item}
		if name, w, ok := strings.Cut(rest, ":"); ok {
			n, err := strconv.Atoi(w)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("--share %q: the weight after ':' is a whole number, at least 1", item)
			}
			m = api.ShareMember{User: prefix + name, Weight: n}
		}
		// gpuletd checks again; this says what is wrong before a round trip.
		if who, err := identity.Parse(m.User); err != nil || who.Kind == identity.Everyone {
			return nil, fmt.Errorf("--share %q: give a user name, a uid, or group:NAME", item)
		}
		out = append(out, m)
	}
	return out, nil
}

// WriteReservations prints a reservation table, by name.
func WriteReservations(w io.Writer, rs []api.Reservation) {
	if len(rs) == 0 {
		fmt.Fprintln(w, "no reservations")
		return
	}
	tw := newTable(w, "NAME", "STATE", "UID", "PRIO", "STAGE", "NEED", "RESERVED", "IN USE", "LENDABLE", "LENT", "RECLAIMED", "SHARE")
	for _, r := range rs {
		reserved := fmt.Sprint(r.Reserved)
		if r.State == api.ReservationPending {
			reserved = fmt.Sprintf("%d held of %d", r.Held, slices.Max(r.Needs))
		}
		lent := fmt.Sprint(r.Lent)
		if r.Reclaiming > 0 {
			lent += fmt.Sprintf(" (%d ending)", r.Reclaiming)
		}
		tw.row(r.Name, r.State, fmt.Sprint(r.Owner.UID), fmt.Sprint(r.Priority), fmt.Sprintf("%d/%d", r.Stage+1, r.Stages),
			fmt.Sprint(r.Need), reserved, fmt.Sprint(r.InUse), fmt.Sprint(r.Lendable), lent, fmt.Sprint(r.Reclaimed), shareText(r))
	}
	tw.flush()
}

// shareText shows the share group, with what each member borrows now.
func shareText(r api.Reservation) string {
	if len(r.Share) == 0 {
		return "-"
	}
	var parts []string
	for _, m := range r.Share {
		p := m.User
		if m.Weight > 0 {
			p += ":" + strconv.Itoa(m.Weight)
		}
		if n := r.LentTo[m.User]; n > 0 {
			p += fmt.Sprintf(" (%d)", n)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ",")
}
