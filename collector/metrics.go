package collector

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

var (
	descNodes     = prometheus.NewDesc("gpulet_collector_nodes", "Nodes known to the collector, by state now.", []string{"state"}, nil)
	descRows      = prometheus.NewDesc("gpulet_collector_table_rows", "Rows of the resource table (one per node and GPU).", nil, nil)
	descSnapshots = prometheus.NewDesc("gpulet_collector_snapshots_total", "Snapshots received since start, by outcome: applied, dropped (not newer than the node's rows), rejected (not a valid snapshot, not the node's credential, or no room in the table) or busy (refused unread: --max-pushes-in-flight bodies were being read).", []string{"outcome"}, nil)
)

// tableCollector reads the table and the counters at each scrape, so that
// ingesting costs no metric updates beyond an atomic counter.
type tableCollector struct{ s *Server }

func (c tableCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c tableCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.s.store.Counts()
	for state, n := range counts.NodesByState {
		ch <- prometheus.MustNewConstMetric(descNodes, prometheus.GaugeValue, float64(n), state)
	}
	ch <- prometheus.MustNewConstMetric(descRows, prometheus.GaugeValue, float64(counts.Rows))
	for _, o := range []struct {
		outcome string
		n       uint64
	}{{"applied", c.s.applied.Load()}, {"dropped", c.s.dropped.Load()}, {"rejected", c.s.rejected.Load()}, {"busy", c.s.busy.Load()}} {
		ch <- prometheus.MustNewConstMetric(descSnapshots, prometheus.CounterValue, float64(o.n), o.outcome)
	}
}

func (s *Server) metricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		tableCollector{s},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
	)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
