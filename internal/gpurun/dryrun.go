package gpurun

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/gpulet/gpulet/client"
)

// dryRun asks gpuletd where the lease would go and prints its answer.
func dryRun(ctx context.Context, o Options, stdout, stderr io.Writer) int {
	c := &client.Client{Socket: o.Socket}
	p, err := c.Place(ctx, o.request())
	if err != nil {
		fmt.Fprintln(stderr, "gpurun: dry run:", describe(err, o))
		return ExitFailure
	}
	if o.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(p); err != nil {
			fmt.Fprintln(stderr, "gpurun: dry run:", err)
			return ExitFailure
		}
		return 0
	}
	fmt.Fprintln(stdout, placementLine(o, p))
	switch {
	case p.Preemptible:
		fmt.Fprintf(stdout, "  borrowed from reservation %s: preemptible (ended, its command told SIGTERM then SIGKILL, when the reservation takes the units back)\n", p.Reservation)
	case p.Reservation != "":
		fmt.Fprintf(stdout, "  drawn on reservation %s\n", p.Reservation)
	}
	for _, cand := range p.Candidates {
		switch {
		case cand.Kept && cand.Score != nil:
			sc := cand.Score
			fmt.Fprintf(stdout, "  GPU %d: kept, score %.3f (card %.3f from cc %.2f, bandwidth %.2f, clock %.2f; similarity %.3f)\n",
				cand.GPU, sc.Total, sc.Card, sc.CC, sc.Bandwidth, sc.Clock, sc.Similarity)
		case cand.Kept:
			fmt.Fprintf(stdout, "  GPU %d: kept\n", cand.GPU)
		default:
			fmt.Fprintf(stdout, "  GPU %d: left out: %s\n", cand.GPU, cand.Why)
		}
	}
	return 0
}
