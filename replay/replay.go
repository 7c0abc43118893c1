// Package replay replays a cluster trace in the protocol of the FGD paper
// ("Beware of Fragmentation", USENIX ATC '23) through gpulet's cluster
// placement (collector/cluster), over node models in memory: the command
// gpulet-replay. docs/replay.md has the protocol and the figures.
package replay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/gpulet/gpulet/collector/cluster"
	"github.com/gpulet/gpulet/placement"
)

// UnitsPerGPU is U in the replay: a pod's gpu_milli is its units.
const UnitsPerGPU = 1000

// MaxArrived is the last arrived percent a curve reports.
const MaxArrived = 130

// Result is one replay of one policy and one seed.
type Result struct {
	Policy string
	Seed   uint64
	// Alloc[p] is the paper's figure at p percent of the cluster's GPU
	// arrived (Figure); Failed[p] the pods failed when the arrived GPU
	// first reached p percent, and Frag[p] the fragmented milli-GPU then
	// (placement.Fragmentation under the mix learned so far; NaN under a
	// paper policy, which keeps no such model).
	Alloc  [MaxArrived + 1]float64
	Failed [MaxArrived + 1]int
	Frag   [MaxArrived + 1]float64
	// Pods is the pods replayed; FailedPods those no node could take.
	Pods, FailedPods int
	// Decisions are the cluster placement's decision times, one per pod.
	Decisions []time.Duration
	Wall      time.Duration
}

// Capacity is the cluster's GPU in milli-GPU.
func Capacity(nodes []TraceNode) int64 {
	var c int64
	for _, n := range nodes {
		c += int64(n.GPUs) * UnitsPerGPU
	}
	return c
}

// newCluster builds the node models of nodes, empty, deciding with e.
func newCluster(nodes []TraceNode, e *placement.Engine) (*cluster.Cluster, error) {
	c := cluster.New(e)
	for _, n := range nodes {
		s := cluster.NodeSpec{Name: n.Name, Units: UnitsPerGPU, CPUMilli: n.CPUMilli, MemoryMiB: n.MemoryMiB}
		for range n.GPUs {
			s.GPUs = append(s.GPUs, cluster.GPUSpec{Name: n.Model})
		}
		if err := c.Add(s); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// request is a pod as the cluster places it.
func request(p Pod) cluster.Request {
	r := cluster.Request{Request: placement.Request{HostCPUMilli: p.CPUMilli, HostMemoryMiB: p.MemoryMiB}, Models: p.Models}
	switch {
	case p.GPUs == 1:
		r.Units = p.GPUMilli
	case p.GPUs > 1:
		r.GPUs = p.GPUs
	}
	return r
}

// Replay places the pods of work, in order, on an empty cluster of nodes
// under gpulet's policy p, none ever leaving. progress, if not nil, is
// called now and then with the pods placed so far.
func Replay(ctx context.Context, nodes []TraceNode, work []Pod, p placement.Policy, seed uint64, progress func(done int)) (Result, error) {
	start := time.Now()
	res := Result{Policy: string(p), Seed: seed, Pods: len(work), Decisions: make([]time.Duration, 0, len(work))}
	learner := cluster.NewLearner()
	base := placement.New(p)
	c, err := newCluster(nodes, base)
	if err != nil {
		return res, err
	}
	capacity := float64(Capacity(nodes))
	if capacity == 0 {
		return res, errors.New("the node list has no GPU")
	}
	var mix *placement.Mix
	var arrived, allocated int64
	arrivals, allocs := make([]int64, 0, len(work)), make([]int64, 0, len(work))
	next := 0 // the next arrived percent to record
	record := func() {
		for next <= MaxArrived && float64(arrived)*100 >= float64(next)*capacity {
			res.Failed[next] = res.FailedPods
			res.Frag[next] = c.Fragmentation(mix)
			next++
		}
	}
	record()
	for i, pod := range work {
		if i%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			if progress != nil {
				progress(i)
			}
		}
		r := request(pod)
		learner.ObserveShape("", cluster.ShapeOf(r))
		if m := learner.Mix(); m != mix {
			mix = m
			if p == placement.Frag {
				c.SetEngine(base.WithMix(mix))
			}
		}
		t0 := time.Now()
		a, err := c.Place(r, 1)
		res.Decisions = append(res.Decisions, time.Since(t0))
		arrived += int64(pod.Milli())
		if err != nil {
			res.FailedPods++
		} else {
			if err := c.Commit(r, a.Ranked[0]); err != nil {
				return res, fmt.Errorf("pod %s: %w", pod.Name, err)
			}
			allocated += int64(pod.Milli())
		}
		arrivals, allocs = append(arrivals, arrived), append(allocs, allocated)
		record()
	}
	// A workload that stops short of the last percents keeps its last
	// figures there.
	for ; next <= MaxArrived; next++ {
		res.Failed[next], res.Frag[next] = res.FailedPods, c.Fragmentation(mix)
	}
	res.Alloc = Figure(arrivals, allocs, Capacity(nodes))
	if progress != nil {
		progress(len(work))
	}
	res.Wall = time.Since(start)
	return res, nil
}

// ReplayPaper places w's pods under one of the paper's policies
// (PaperPolicies); pods is the pod list as read, whose shapes FGD weighs.
func ReplayPaper(ctx context.Context, nodes []TraceNode, pods []Pod, w Workload, policy string, seed uint64, progress func(done int)) (Result, error) {
	start := time.Now()
	res := Result{Policy: policy, Seed: seed, Pods: len(w.Pods)}
	capacity := Capacity(nodes)
	if capacity == 0 {
		return res, errors.New("the node list has no GPU")
	}
	arrived, allocated, failedAt, decisions, err := paperReplay(ctx, nodes, pods, w, policy, progress)
	if err != nil {
		return res, err
	}
	res.Decisions = decisions
	res.Alloc = Figure(arrived, allocated, capacity)
	next := 1 // nothing has failed before the first pod
	for i := range arrived {
		res.FailedPods = failedAt[i]
		for ; next <= MaxArrived && arrived[i]*100 >= int64(next)*capacity; next++ {
			res.Failed[next] = res.FailedPods
		}
	}
	for ; next <= MaxArrived; next++ {
		res.Failed[next] = res.FailedPods
	}
	for i := range res.Frag {
		res.Frag[i] = math.NaN()
	}
	res.Wall = time.Since(start)
	return res, nil
}
