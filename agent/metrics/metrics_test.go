package metrics

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpulet/gpulet/api"
)

func TestRenderIsValidExpositionOfTheSnapshot(t *testing.T) {
	s := &api.Snapshot{Node: "n", Backend: "simulated", MPS: "on", State: api.NodeDraining, Seq: 7, GPUs: []api.GPU{{
		Index: 0, UUID: "GPU-a", Name: "Tesla T4", State: api.GPUDegraded, UnitsTotal: 16, UnitsUsed: 5, UnitsFree: 11,
		UnitsOffline: 2, UnitsReserved: 4, UtilizationPct: 40, MemoryTotalMiB: 15360, MemoryUsedMiB: 1024,
		Instances: []api.Instance{{Instance: 0, State: api.InstanceDown, Clients: 3}},
	}}, UnitsReserved: 4, Reservations: []api.ReservationStatus{
		{Name: "wf1", State: api.ReservationActive, Reserved: 8, Stage: 1, Need: 6, InUse: 3, Lendable: 2, Lent: 2, Reclaimed: 4},
		{Name: "wf2", State: api.ReservationPending, Held: 2, Need: 4},
	}}
	b := Render(s, Leases{Live: 3, Granted: 40, Ended: 37})
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not valid exposition: %v\n%s", err, b)
	}
	value := func(name string, labels map[string]string) float64 {
		t.Helper()
		f, ok := fams[name]
		if !ok {
			t.Fatalf("no %s", name)
		}
	next:
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
		t.Fatalf("no %s with %v", name, labels)
		return 0
	}
	gpu := map[string]string{"gpu": "0", "uuid": "GPU-a", "name": "Tesla T4"}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"gpulet_units", gpu, 16},
		{"gpulet_units_used", gpu, 5},
		{"gpulet_units_free", gpu, 11},
		{"gpulet_units_offline", gpu, 2},
		{"gpulet_gpu_utilization_percent", gpu, 40},
		{"gpulet_gpu_memory_used_bytes", gpu, 1024 << 20},
		{"gpulet_gpu_state", map[string]string{"state": "degraded"}, 1},
		{"gpulet_gpu_state", map[string]string{"state": "working"}, 0},
		{"gpulet_node_state", map[string]string{"state": "draining"}, 1},
		{"gpulet_node_state", map[string]string{"state": "degraded"}, 0},
		{"gpulet_mps_instance_up", map[string]string{"instance": "0"}, 0},
		{"gpulet_mps_instance_clients", map[string]string{"instance": "0"}, 3},
		{"gpulet_leases", nil, 3},
		{"gpulet_leases_granted_total", nil, 40},
		{"gpulet_leases_ended_total", nil, 37},
		{"gpulet_snapshot_seq", nil, 7},
		{"gpulet_units_reserved", gpu, 4},
		{"gpulet_node_units_reserved", nil, 4},
		{"gpulet_reservation_pending", map[string]string{"reservation": "wf1"}, 0},
		{"gpulet_reservation_pending", map[string]string{"reservation": "wf2"}, 1},
		{"gpulet_reservation_stage", map[string]string{"reservation": "wf1"}, 1},
		{"gpulet_reservation_units_reserved", map[string]string{"reservation": "wf1"}, 8},
		{"gpulet_reservation_units_need", map[string]string{"reservation": "wf1"}, 6},
		{"gpulet_reservation_units_in_use", map[string]string{"reservation": "wf1"}, 3},
		{"gpulet_reservation_units_lendable", map[string]string{"reservation": "wf1"}, 2},
		{"gpulet_reservation_units_lent", map[string]string{"reservation": "wf1"}, 2},
		{"gpulet_reservation_units_reclaimed", map[string]string{"reservation": "wf1"}, 4},
		{"gpulet_reservation_units_need", map[string]string{"reservation": "wf2"}, 4},
	}
	for _, c := range checks {
		if got := value(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// The live part carries the process, Go runtime and build collectors and the
// lease latency histogram, by result.
func TestLiveMetrics(t *testing.T) {
	now := time.Unix(1700000000, 0)
	l := NewLive(func() []api.UpstreamStatus {
		return []api.UpstreamStatus{{URL: "http://s/x", Pushes: 3, Failures: 1, LastSuccess: &now}}
	})
	l.ObserveLease(250*time.Microsecond, true)
	l.ObserveLease(2*time.Second, false)
	out := string(l.Render())
	for _, want := range []string{
		"go_goroutines ", "process_cpu_seconds_total ", "go_build_info{",
		`gpulet_lease_request_duration_seconds_bucket{result="granted",le="0.0001"} 0`,
		`gpulet_lease_request_duration_seconds_bucket{result="granted",le="0.0003"} 1`,
		`gpulet_lease_request_duration_seconds_count{result="granted"} 1`,
		`gpulet_lease_request_duration_seconds_count{result="refused"} 1`,
		`gpulet_upstream_pushes_total{url="http://s/x"} 3`,
		`gpulet_upstream_failures{url="http://s/x"} 1`,
		`gpulet_upstream_last_success_timestamp_seconds{url="http://s/x"} 1.7e+09`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("live metrics lack %q", want)
		}
	}
}

// TestQuotaOverIsExposed: a quota held above its limit is a gauge of the
// units beyond it, labelled by the quota.
func TestQuotaOverIsExposed(t *testing.T) {
	s := &api.Snapshot{Node: "n", OverQuota: []api.QuotaOver{{Quota: "alice", Limit: 4, Held: 13}, {Quota: "*", Limit: 8, Held: 7, Reserved: 3}}}
	out := string(Render(s, Leases{}))
	for _, want := range []string{`gpulet_quota_over_units{quota="alice"} 9`, `gpulet_quota_over_units{quota="*"} 2`} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %s in\n%s", want, out)
		}
	}
}

// TestNodeInfoNamesTheBuild: gpulet_node_info carries the snapshot's version
// and commit as labels, so that a dashboard can tell nodes' gpuletd apart.
func TestNodeInfoNamesTheBuild(t *testing.T) {
	s := &api.Snapshot{Node: "n", Backend: "simulated", MPS: "off", BootID: "b", Version: "v1.2.3", Commit: "abc123"}
	out := string(Render(s, Leases{}))
	want := `gpulet_node_info{backend="simulated",boot_id="b",commit="abc123",mps="off",node="n",version="v1.2.3"} 1`
	if !strings.Contains(out, want) {
		t.Errorf("missing %s in\n%s", want, out)
	}
}
