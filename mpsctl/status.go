package mpsctl

import (
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/pipefile"
)

// Status reports the instances of one GPU in order of k; nil for a GPU it does
// not know.
func (d *Daemons) Status(gpuUUID string) []InstanceStatus {
	insts := d.byGPU[gpuUUID]
	if insts == nil {
		return nil
	}
	out := make([]InstanceStatus, len(insts))
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, in := range insts {
		s := InstanceStatus{Instance: in.k, State: in.state, PID: in.pid, Clients: in.clients, Err: in.err}
		if in.serverUID != nil {
			uid := *in.serverUID
			s.ServerUID = &uid
		}
		// Published probe results are never modified, only replaced.
		s.Servers = in.servers
		out[i] = s
	}
	return out
}

// lookup returns instance k of a known GPU with MPS on, or nil.
func (d *Daemons) lookup(gpuUUID string, k int) *instance {
	insts := d.byGPU[gpuUUID]
	if !d.on() || k < 0 || k >= len(insts) {
		return nil
	}
	return insts[k]
}

// PipeDir is CUDA_MPS_PIPE_DIRECTORY of instance k of the GPU; "" when MPS is off
// or the GPU or k is unknown.
func (d *Daemons) PipeDir(gpuUUID string, k int) string {
	if in := d.lookup(gpuUUID, k); in != nil {
		return in.pipeDir
	}
	return ""
}

// LogDir is CUDA_MPS_LOG_DIRECTORY of instance k of the GPU; "" when MPS is off
// or the GPU or k is unknown.
func (d *Daemons) LogDir(gpuUUID string, k int) string {
	if in := d.lookup(gpuUUID, k); in != nil {
		return in.logDir
	}
	return ""
}

// Env is what a client of instance k of the GPU adds to its environment
// (CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY); nil when MPS is off or
// the GPU or k is unknown. The caller owns the map.
func (d *Daemons) Env(gpuUUID string, k int) map[string]string {
	in := d.lookup(gpuUUID, k)
	if in == nil {
		return nil
	}
	return map[string]string{
		pipefile.EnvPipeDirectory: in.pipeDir,
		pipefile.EnvLogDirectory:  in.logDir,
	}
}

// setRunning records a successful probe and returns the previous state.
func (d *Daemons) setRunning(in *instance, st probeResult) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	prev := in.state
	if prev != api.InstanceRunning {
		in.runningSince = d.cfg.Now()
	}
	in.state = api.InstanceRunning
	in.err = nil
	in.pid = st.pid
	in.serverUID = st.serverUID
	in.clients = st.clients
	in.servers = st.servers
	return prev
}

// setDown records that the instance is down and returns the wait before its
// next restart.
func (d *Daemons) setDown(in *instance, err error) time.Duration {
	now := d.cfg.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.markDownLocked(in, err, now)
	return in.retryAt.Sub(now)
}

// markDownLocked marks the instance down because of err and schedules its next
// restart, the wait doubling with each consecutive failure.
func (d *Daemons) markDownLocked(in *instance, err error, now time.Time) {
	if in.state == api.InstanceRunning && now.Sub(in.runningSince) >= d.cfg.MaxBackoff {
		// It ran long enough to count as healthy: a new failure, not a crash loop.
		in.failures = 0
	}
	in.state = api.InstanceDown
	in.err = err
	in.pid = 0
	in.serverUID = nil
	in.clients = 0
	in.servers = nil
	in.retryAt = now.Add(backoff(d.cfg.MinBackoff, d.cfg.MaxBackoff, in.failures))
	in.failures++
}

// backoff is lo doubled n times, at most hi.
func backoff(lo, hi time.Duration, n int) time.Duration {
	b := lo
	for ; n > 0 && b < hi; n-- {
		b *= 2
	}
	return min(b, hi)
}
