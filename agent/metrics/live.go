package metrics

import (
	"bytes"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"
)

// Live is the part of the exposition read at each scrape rather than from a
// snapshot: what operators expect of any Go daemon (its process, the Go
// runtime, its build) and how long lease requests take. An idle node makes
// no new snapshot, so none of this can ride on one.
type Live struct {
	reg          *prometheus.Registry
	leaseSeconds *prometheus.HistogramVec
}

// NewLive registers the process, Go runtime and build collectors and the
// lease latency histogram.
func NewLive() *Live {
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
	return l
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
