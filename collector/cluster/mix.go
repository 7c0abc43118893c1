package cluster

import "github.com/gpulet/gpulet/placement"

// The frag policy's learner over a whole cluster's requests, the same for
// the collector's placements and gpulet-replay, which both place them: it
// remembers about the last mixWindow requests, weighs the mixShapes most
// frequent shapes, and publishes a new mix every mixEvery requests.
//
// A cluster is asked for the requests of many nodes, where a node learns
// from its own: the last 1,024, a new mix in force every 32
// (agent/policy.go). The window is four times a node's, as it holds many
// nodes' requests. And a new mix costs a cluster more: SetEngine drops
// every node's kept answers and floors, so that the next placement reads
// every node's floor again (10,000 of them in a collector). Every 1,024
// requests keeps that a small share of the placements' cost. The first
// request publishes a mix at once (a Learner without one publishes), so a
// cluster under frag leaves best-fit with it.
const (
	mixWindow = 4096
	mixShapes = 16
	mixEvery  = 1024
)

// NewLearner is a learner of a cluster's request mix (mixWindow, mixShapes,
// mixEvery).
func NewLearner() *placement.Learner { return placement.NewLearner(mixWindow, mixShapes, mixEvery) }
