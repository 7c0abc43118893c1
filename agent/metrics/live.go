package metrics

import (
	"bytes"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"

	"github.com/gpulet/gpulet/api"
)

// Live is the part of the exposition read at each scrape rather than from a
// snapshot: what operators expect of any Go daemon (its process, the Go
// runtime, its build) and how long lease requests take. An idle node makes
// no new snapshot, so none of this can ride on one.
type Live struct {
	reg          *prometheus.Registry
	leaseSeconds *prometheus.HistogramVec
}

// NewLive registers the process, Go runtime and build collectors, the lease
// latency histogram, and the push state of each upstream that upstreams
// (which may be nil) gives at each scrape.
func NewLive(upstreams func() []api.UpstreamStatus) *Live {
	l := &Live{
		reg: prometheus.NewRegistry(),
		leaseSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gpulet_lease_request_duration_seconds",
			Help: "Time from a lease request's arrival to its answer, by result (granted or refused); waits included.",
			// A grant takes about 0.1 ms to a few ms; a wait up to its limit.
			Buckets: []float64{0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 60},
		}, []string{"result"}),
	}
	l.reg.MustRegister(
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewGoCollector(),
		collectors.NewBuildInfoCollector(),
		l.leaseSeconds,
	)
	if upstreams != nil {
		l.reg.MustRegister(upstreamCollector(upstreams))
	}
	return l
}

var (
	descPushes      = prometheus.NewDesc("gpulet_upstream_pushes_total", "Snapshots pushed to the upstream since gpuletd started.", []string{"url"}, nil)
	descFailures    = prometheus.NewDesc("gpulet_upstream_failures", "Pushes to the upstream that failed in a row, now.", []string{"url"}, nil)
	descLastSuccess = prometheus.NewDesc("gpulet_upstream_last_success_timestamp_seconds", "When a push to the upstream last succeeded (0: never).", []string{"url"}, nil)
)

// upstreamCollector reads the push state at each scrape.
type upstreamCollector func() []api.UpstreamStatus

func (c upstreamCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descPushes
	ch <- descFailures
	ch <- descLastSuccess
}

func (c upstreamCollector) Collect(ch chan<- prometheus.Metric) {
	for _, u := range c() {
		ch <- prometheus.MustNewConstMetric(descPushes, prometheus.CounterValue, float64(u.Pushes), u.URL)
		ch <- prometheus.MustNewConstMetric(descFailures, prometheus.GaugeValue, float64(u.Failures), u.URL)
		last := 0.0
		if u.LastSuccess != nil {
			last = float64(u.LastSuccess.UnixNano()) / 1e9
		}
		ch <- prometheus.MustNewConstMetric(descLastSuccess, prometheus.GaugeValue, last, u.URL)
	}
}

// ObserveLease records how long a lease request took and whether it was
// granted.
func (l *Live) ObserveLease(d time.Duration, granted bool) {
	result := "refused"
	if granted {
		result = "granted"
	}
	l.leaseSeconds.WithLabelValues(result).Observe(d.Seconds())
}

// Render is the live part's text exposition, gathered now.
func (l *Live) Render() []byte {
	mfs, err := l.reg.Gather()
	if err != nil {
		return []byte("# gpulet: cannot gather live metrics: " + err.Error() + "\n")
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return []byte("# gpulet: cannot encode live metrics: " + err.Error() + "\n")
		}
	}
	return buf.Bytes()
}
