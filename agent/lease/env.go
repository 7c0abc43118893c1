package lease

import (
	"fmt"
	"maps"
	"strconv"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/pipefile"
)

// EnvFor is the environment of n units on an instance of GPU dev whose MPS
// variables (pipe and log folders) are instanceEnv: what a lease gives and,
// for one unit, what layout.json gives an offline claimer. memMiB is the
// pinned memory asked for; 0 means the units' share of the GPU.
func EnvFor(model units.Model, dev inventory.Device, instanceEnv map[string]string, mps bool, n int, memMiB uint64) map[string]string {
	env := map[string]string{
		pipefile.EnvVisibleDevices:   dev.UUID,
		pipefile.EnvThreadPercentage: strconv.Itoa(model.ThreadPercentage(n)),
	}
	if !mps {
		return env
	}
	for k, v := range instanceEnv {
		env[k] = v
	}
	if memMiB == 0 {
		memMiB = model.MemoryShareMiB(n, dev.MemoryTotalMiB)
	}
	env[pipefile.EnvPinnedMemLimit] = fmt.Sprintf("0=%dM", memMiB)
	return env
}

// envKey names the leases whose environments are alike: those of as many
// units on one instance of a GPU.
type envKey struct{ gpu, instance, units int }

// sharedEnvLocked returns env, or an equal map that an earlier lease of l's
// instance and unit count holds. A lease's environment is a map of a few
// entries that costs more memory than the rest of the lease, and the leases
// of one instance nearly all have the same one; no lease's Env is changed
// once set, so they can share it. Only leases with the default memory limit
// share, so that the table stays within GPUs × instances × units per
// process, whatever memory limits are asked; a different environment for
// the same key (MPS's folders changed) takes the key's place.
func (m *Manager) sharedEnvLocked(l *api.Lease, env map[string]string) map[string]string {
	if l.MemoryMiB != 0 || env == nil || len(l.GPUs) > 0 {
		return env
	}
	key := envKey{l.GPU.Index, l.Instance, len(l.Units)}
	if shared, ok := m.envs[key]; ok && maps.Equal(shared, env) {
		return shared
	}
	m.envs[key] = env
	return env
}
