// Package metrics renders a snapshot as Prometheus text exposition through
// prometheus/client_golang, so that the API and the FUSE view serve the same
// bytes for the same snapshot.
package metrics

import (
	"bytes"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/gpulet/gpulet/api"
)

// ContentType is the exposition's content type.
var ContentType = string(expfmt.NewFormat(expfmt.TypeTextPlain))

var (
	gpuLabels       = []string{"gpu", "uuid", "name"}
	descNode        = prometheus.NewDesc("gpulet_node_info", "The node: name, backend, MPS mode, and the gpuletd that serves it (module version and commit); value 1.", []string{"node", "backend", "mps", "boot_id", "version", "commit"}, nil)
	descNodeState   = prometheus.NewDesc("gpulet_node_state", "1 for the node's current state.", []string{"state"}, nil)
	descSeq         = prometheus.NewDesc("gpulet_snapshot_seq", "Sequence number of the snapshot within this daemon run.", nil, nil)
	descLeases      = prometheus.NewDesc("gpulet_leases", "Live leases.", nil, nil)
	descGranted     = prometheus.NewDesc("gpulet_leases_granted_total", "Leases granted since gpuletd started.", nil, nil)
	descEnded       = prometheus.NewDesc("gpulet_leases_ended_total", "Leases ended (released, expired, holder exited) since gpuletd started.", nil, nil)
	descTotal       = prometheus.NewDesc("gpulet_units", "Units of the GPU, in all.", gpuLabels, nil)
	descUsed        = prometheus.NewDesc("gpulet_units_used", "Units with a pipe file (leased or claimed offline).", gpuLabels, nil)
	descFree        = prometheus.NewDesc("gpulet_units_free", "Units neither used nor reserved.", gpuLabels, nil)
	descOffline     = prometheus.NewDesc("gpulet_units_offline", "Units claimed offline.", gpuLabels, nil)
	descReserved    = prometheus.NewDesc("gpulet_units_reserved", "Units set aside by reservations and not in use.", gpuLabels, nil)
	descUtil        = prometheus.NewDesc("gpulet_gpu_utilization_percent", "Share of the GPU's SMs in use, the figure --max-utilization compares (see the snapshot's utilization_source).", gpuLabels, nil)
	descKernelTime  = prometheus.NewDesc("gpulet_gpu_kernel_time_percent", "Share of time in which any kernel ran (NVML's utilization.gpu).", gpuLabels, nil)
	descOutside     = prometheus.NewDesc("gpulet_gpu_outside_memory_bytes", "GPU memory of processes that belong to no lease, no offline claim and no MPS server of gpulet's.", gpuLabels, nil)
	descOutsideOver = prometheus.NewDesc("gpulet_gpu_outside_over_share", "1 while processes beside gpulet use more memory than the leases leave free.", gpuLabels, nil)
	descOverShare   = prometheus.NewDesc("gpulet_gpu_leases_over_share", "Leases and offline claims whose processes use more memory than their share.", gpuLabels, nil)
	descInstSM      = prometheus.NewDesc("gpulet_mps_instance_sm_percent", "SM utilization of the MPS instance's server, as NVML gives it per process.", []string{"gpu", "uuid", "instance"}, nil)
	leaseLabels     = []string{"lease", "gpu", "uid"}
	descLeaseMem    = prometheus.NewDesc("gpulet_lease_memory_used_bytes", "GPU memory of a lease's processes; only leases with a process on the GPU have a series, which ends with the lease.", leaseLabels, nil)
	descLeaseOver   = prometheus.NewDesc("gpulet_lease_over_share", "1 while a lease's processes use more memory than its share; series as gpulet_lease_memory_used_bytes.", leaseLabels, nil)
	descMaxUtil     = prometheus.NewDesc("gpulet_gpu_max_utilization_percent", "Utilization above which the GPU takes no new leases.", gpuLabels, nil)
	descMemUsed     = prometheus.NewDesc("gpulet_gpu_memory_used_bytes", "GPU memory in use.", gpuLabels, nil)
	descMemTotal    = prometheus.NewDesc("gpulet_gpu_memory_total_bytes", "GPU memory.", gpuLabels, nil)
	descEligible    = prometheus.NewDesc("gpulet_gpu_eligible", "1 when the GPU takes new leases.", gpuLabels, nil)
	descGPUState    = prometheus.NewDesc("gpulet_gpu_state", "1 for the GPU's current state.", append(gpuLabels[:3:3], "state"), nil)
	descInstUp      = prometheus.NewDesc("gpulet_mps_instance_up", "1 when the MPS instance is running (or MPS is off).", []string{"gpu", "uuid", "instance", "state"}, nil)
	descInstClient  = prometheus.NewDesc("gpulet_mps_instance_clients", "Clients of the MPS instance.", []string{"gpu", "uuid", "instance"}, nil)

	descNodeReserved = prometheus.NewDesc("gpulet_node_units_reserved", "Units of the node set aside by reservations and not in use.", nil, nil)
	resLabels        = []string{"reservation"}
	descResPending   = prometheus.NewDesc("gpulet_reservation_pending", "1 while the reservation waits for its units.", resLabels, nil)
	descResStage     = prometheus.NewDesc("gpulet_reservation_stage", "The reservation's current stage, from 0.", resLabels, nil)
	descResReserved  = prometheus.NewDesc("gpulet_reservation_units_reserved", "Units the reservation has set aside.", resLabels, nil)
	descResNeed      = prometheus.NewDesc("gpulet_reservation_units_need", "Units the current stage needs.", resLabels, nil)
	descResInUse     = prometheus.NewDesc("gpulet_reservation_units_in_use", "Units of the reservation its owner holds.", resLabels, nil)
	descResLendable  = prometheus.NewDesc("gpulet_reservation_units_lendable", "Units the current stage may lend (reserved minus need).", resLabels, nil)
	descResLent      = prometheus.NewDesc("gpulet_reservation_units_lent", "Units of the reservation borrowers hold.", resLabels, nil)
	descResReclaimed = prometheus.NewDesc("gpulet_reservation_units_reclaimed", "Units taken back from borrowers when the current stage started.", resLabels, nil)
	descQuotaOver    = prometheus.NewDesc("gpulet_quota_over_units", "Units held (and reserved) beyond a quota's limit, for each quota held above its limit (offline claims, a lowered quota); its holders get no new lease until back under.", []string{"quota"}, nil)
)

// Leases counts leases for the exposition.
type Leases struct {
	// Live is the number of live leases; Granted and Ended count since start.
	Live, Granted, Ended uint64
	// Measured are the leases with a process on a GPU, as last measured.
	Measured []Measured
}

// Measured is one lease's measured use.
type Measured struct {
	ID        string
	GPU       int
	UID       uint32
	MemoryMiB uint64
	OverShare bool
}

type collector struct {
	s      *api.Snapshot
	leases Leases
}

func (c collector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(descNode, 1, s.Node, s.Backend, s.MPS, s.BootID, s.Version, s.Commit)
	for _, st := range []string{api.NodeWorking, api.NodeDraining, api.NodeDegraded} {
		gauge(descNodeState, b2f(s.State == st), st)
	}
	gauge(descSeq, float64(s.Seq))
	gauge(descNodeReserved, float64(s.UnitsReserved))
	for _, r := range s.Reservations {
		if r.Name == "" {
			// A redacted snapshot (--listen) hides the names these
			// series are told apart by.
			continue
		}
		gauge(descResPending, b2f(r.State == api.ReservationPending), r.Name)
		gauge(descResStage, float64(r.Stage), r.Name)
		gauge(descResReserved, float64(r.Reserved), r.Name)
		gauge(descResNeed, float64(r.Need), r.Name)
		gauge(descResInUse, float64(r.InUse), r.Name)
		gauge(descResLendable, float64(r.Lendable), r.Name)
		gauge(descResLent, float64(r.Lent), r.Name)
		gauge(descResReclaimed, float64(r.Reclaimed), r.Name)
	}
	for _, q := range s.OverQuota {
		if q.Quota == "" {
			// A redacted snapshot hides the users and groups these
			// series are told apart by.
			continue
		}
		gauge(descQuotaOver, float64(q.Held+q.Reserved-q.Limit), q.Quota)
	}
	gauge(descLeases, float64(c.leases.Live))
	ch <- prometheus.MustNewConstMetric(descGranted, prometheus.CounterValue, float64(c.leases.Granted))
	ch <- prometheus.MustNewConstMetric(descEnded, prometheus.CounterValue, float64(c.leases.Ended))
	for _, m := range c.leases.Measured {
		l := []string{m.ID, strconv.Itoa(m.GPU), strconv.FormatUint(uint64(m.UID), 10)}
		gauge(descLeaseMem, float64(m.MemoryMiB)*(1<<20), l...)
		gauge(descLeaseOver, b2f(m.OverShare), l...)
	}
	for _, g := range s.GPUs {
		l := []string{strconv.Itoa(g.Index), g.UUID, g.Name}
		gauge(descTotal, float64(g.UnitsTotal), l...)
		gauge(descUsed, float64(g.UnitsUsed), l...)
		gauge(descFree, float64(g.UnitsFree), l...)
		gauge(descOffline, float64(g.UnitsOffline), l...)
		gauge(descReserved, float64(g.UnitsReserved), l...)
		gauge(descUtil, float64(g.UtilizationPct), l...)
		gauge(descKernelTime, float64(g.KernelTimePct), l...)
		gauge(descOutside, float64(g.OutsideMemoryMiB)*(1<<20), l...)
		gauge(descOutsideOver, b2f(g.OutsideOverShare), l...)
		gauge(descOverShare, float64(g.LeasesOverShare), l...)
		gauge(descMaxUtil, float64(g.MaxUtilizationPct), l...)
		gauge(descMemUsed, float64(g.MemoryUsedMiB)*(1<<20), l...)
		gauge(descMemTotal, float64(g.MemoryTotalMiB)*(1<<20), l...)
		gauge(descEligible, b2f(g.Eligible), l...)
		for _, st := range []string{api.GPUWorking, api.GPUDegraded, api.GPUFailed} {
			gauge(descGPUState, b2f(g.State == st), append(l[:3:3], st)...)
		}
		for _, in := range g.Instances {
			k := strconv.Itoa(in.Instance)
			gauge(descInstUp, b2f(api.InstanceTakesLeases(in.State)), l[0], g.UUID, k, in.State)
			gauge(descInstClient, float64(in.Clients), l[0], g.UUID, k)
			if in.SMPct != nil {
				gauge(descInstSM, float64(*in.SMPct), l[0], g.UUID, k)
			}
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Render returns the text exposition of s and the lease counts.
func Render(s *api.Snapshot, leases Leases) []byte {
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(collector{s: s, leases: leases}); err != nil {
		return []byte("# gpulet: cannot register metrics: " + err.Error() + "\n")
	}
	mfs, err := reg.Gather()
	if err != nil {
		return []byte("# gpulet: cannot gather metrics: " + err.Error() + "\n")
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return []byte("# gpulet: cannot encode metrics: " + err.Error() + "\n")
		}
	}
	return buf.Bytes()
}
