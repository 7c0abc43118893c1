package lease

import "time"

// exited ends lease id because its process exited and, when the lease ran a
// task, tells TaskRan how long it ran on its GPU's model: the measured run
// times that task–engine affinity learns from. A lease ended any other way
// (released, expired, reclaimed) says nothing of the task's run time; nor
// does a reclaimed borrower's, though it ends by its process exiting: the
// process was told to end (SIGTERM, SIGKILL), its task did not finish.
func (m *Manager) exited(id string) {
	if !m.lockOpen() {
		return
	}
	var task, model string
	var uid uint32
	var ran time.Duration
	if l, ok := m.leases[id]; ok {
		if l.Task != "" && !l.reclaiming {
			task, model, uid, ran = l.Task, m.gpus[l.GPU.Index].dev.Name, l.Owner.UID, m.clock.Now().Sub(l.Created)
		}
		m.dropAndRecordLocked(l, "process exited", true)
	}
	m.unlock()
	if task != "" && ran > 0 {
		m.cfg.TaskRan(task, model, uid, ran)
	}
}
