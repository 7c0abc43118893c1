package cluster

import (
	"errors"
	"slices"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/placement"
)

// What the GPU models a request accepts (Request.Models) mean to a
// cluster: the engine's type filter takes one, so a node of several
// models is asked once per model accepted.

// fitsModels says whether s has a GPU of a model r accepts, if r asks one.
func (s *summary) fitsModels(r *Request) bool {
	if (r.GPUs > 0 || r.Units > 0) && len(r.Models) > 0 {
		for _, m := range s.models {
			if r.acceptsModel(m) {
				return true
			}
		}
		return false
	}
	return true
}

// acceptsModel says whether r's Models accept a GPU of model m.
func (r *Request) acceptsModel(m string) bool {
	ok, known := r.accepts[m]
	if !known {
		ok = slices.ContainsFunc(r.Models, func(want string) bool { return api.MatchType(want, m) })
		if r.accepts == nil {
			r.accepts = map[string]bool{}
		}
		r.accepts[m] = ok
	}
	return ok
}

// modelsAccept says whether every GPU of choice ch is of a model asked.
func modelsAccept(models []string, m *placement.Node, ch placement.Choice) bool {
	gpus := ch.GPUs
	if len(gpus) == 0 {
		gpus = []int{ch.GPU}
	}
	for _, idx := range gpus {
		for gi := range m.GPUs {
			if m.GPUs[gi].Index == idx && !slices.ContainsFunc(models, func(want string) bool { return api.MatchType(want, m.GPUs[gi].Name) }) {
				return false
			}
		}
	}
	return true
}

// placeByModel asks the engine once per model asked (the engine's type
// filter takes one) and keeps the best answer under the policy.
func (c *Cluster) placeByModel(n *node, r *Request, units bool) (placement.Decision, error) {
	var best placement.Decision
	var errs []error
	found := false
	for _, m := range r.Models {
		one := r.Request
		one.Type = m
		d, err := c.engineDecide(n, one, units)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !found || c.before(Verdict{Best: d.Best}, Verdict{Best: best.Best}) {
			best, found = d, true
		}
	}
	if !found {
		return best, errors.Join(errs...)
	}
	return best, nil
}
