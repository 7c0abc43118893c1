package reporter

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gpulet/gpulet/api"
)

// Group is the senders of every upstream, and how pushing to each goes,
// published as one immutable value at each change. The snapshot build and
// the metrics read that value and reach into no sender; a sender reaches
// nothing but its Source and the Group. Whoever shows the push state in
// something made once (the snapshot) waits on StateChanged to make it anew.
type Group struct {
	senders []*Sender
	status  atomic.Pointer[[]api.UpstreamStatus]

	mu sync.Mutex // orders the publishes; guards changed
	// changed is closed when an upstream starts failing or works again.
	changed chan struct{}
}

// NewGroup makes a sender for each of cfgs, in their order, reading from
// src; it fails as New does.
func NewGroup(cfgs []Config, src Source) (*Group, error) {
	g := &Group{changed: make(chan struct{})}
	var status []api.UpstreamStatus
	for i, cfg := range cfgs {
		s, err := New(cfg, src)
		if err != nil {
			return nil, err
		}
		s.published = func(st api.UpstreamStatus, stateChanged bool) { g.publish(i, st, stateChanged) }
		g.senders = append(g.senders, s)
		status = append(status, s.Status())
	}
	g.status.Store(&status)
	return g, nil
}

// Run pushes to every upstream until ctx ends, and returns once every sender
// has stopped.
func (g *Group) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, s := range g.senders {
		wg.Go(func() { s.Run(ctx) })
	}
	wg.Wait()
}

// Status is how pushing to each upstream goes, in the order of the configs:
// the value last published, shared by every caller, who must not modify it.
func (g *Group) Status() []api.UpstreamStatus { return *g.status.Load() }

// StateChanged is closed when an upstream next starts failing or works
// again. Not at every push: that would make a snapshot per push.
func (g *Group) StateChanged() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.changed
}

// publish replaces upstream i's status in a new value; each sender
// publishes its own in order.
func (g *Group) publish(i int, st api.UpstreamStatus, stateChanged bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	status := slices.Clone(*g.status.Load())
	status[i] = st
	g.status.Store(&status)
	if stateChanged {
		close(g.changed)
		g.changed = make(chan struct{})
	}
}
