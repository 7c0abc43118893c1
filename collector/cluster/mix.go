package cluster

import "github.com/gpulet/gpulet/placement"

// The frag policy's learner over a whole cluster's requests, the same for
// the collector's placements and gpulet-replay, which both place them: it
// remembers about the last mixWindow requests, weighs the mixShapes most
// frequent shapes, and publishes a new mix every mixEvery requests.
//
// 32 shapes, not 16: a shape is a request's units or GPUs with its CPU and
// memory, so a cluster's many sizes of pods of several whole GPUs each come
// out rare, and with 16 none of them was in the mix, which then kept no
// node's whole GPUs for them. In the FGD paper's protocol on the openb
// multigpu30 list (seed 42) frag allocated 89.9% at 100% arrived with 16
// shapes and 96.6% with 32 (docs/replay.md, "What was tried").
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
	mixShapes = 32
	mixEvery  = 1024
)

// NewLearner is a learner of a cluster's request mix (mixWindow, mixShapes,
// mixEvery).
func NewLearner() *placement.Learner { return placement.NewLearner(mixWindow, mixShapes, mixEvery) }
