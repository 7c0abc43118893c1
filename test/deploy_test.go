package test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The Grafana dashboards and Prometheus alert rules under deploy/ read
// gpulet's metrics: these tests hold them to what gpuletd and the collector
// export, and to PromQL as promtool parses it.

const alertRules = "../deploy/prometheus/gpulet-alerts.yml"

// exportedMetrics are the metric names gpuletd and gpulet-collector define,
// read from their sources (every NewDesc and every collector's Name), with a
// histogram's series.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob("../agent/metrics/*.go")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../collector/metrics.go")
	def := regexp.MustCompile(`(?:NewDesc\(|Name:\s*)"(gpulet_[a-z_]+)"`)
	names := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range def.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
			if strings.HasSuffix(m[1], "_seconds") {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					names[m[1]+s] = true
				}
			}
		}
	}
	if !names["gpulet_units_free"] || !names["gpulet_collector_nodes"] || !names["gpulet_lease_request_duration_seconds_bucket"] {
		t.Fatalf("the metric names read from the sources lack some that exist: %v", names)
	}
	return names
}

// dashboardQueries are each dashboard's PromQL, by file and panel title.
func dashboardQueries(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("../deploy/grafana/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards under deploy/grafana: %v", err)
	}
	out := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			UID    string
			Panels []struct {
				Title   string
				Targets []struct{ Expr string }
			}
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if d.UID == "" || len(d.Panels) == 0 {
			t.Fatalf("%s: no uid or no panels", f)
		}
		for _, p := range d.Panels {
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", f, p.Title)
			}
			for i, tg := range p.Targets {
				out[fmt.Sprintf("%s: %s #%d", filepath.Base(f), p.Title, i)] = tg.Expr
			}
		}
	}
	return out
}

// alertQueries are the alert rules' expressions, by alert.
func alertQueries(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(alertRules)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out["alert "+r.Alert] = r.Expr
		}
	}
	return out
}

// TestDeployQueriesNameExportedMetrics: every gpulet_ metric a dashboard or an
// alert reads is one gpuletd or the collector exports, and every query reads
// at least one.
func TestDeployQueriesNameExportedMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	metric := regexp.MustCompile(`\bgpulet_[a-z_]+`)
	queries := dashboardQueries(t)
	for k, v := range alertQueries(t) {
		queries[k] = v
	}
	for where, q := range queries {
		names := metric.FindAllString(q, -1)
		if len(names) == 0 {
			t.Errorf("%s: %q reads no gpulet metric", where, q)
		}
		for _, n := range names {
			if !exported[n] {
				t.Errorf("%s: %q reads %s, which neither gpuletd nor the collector exports", where, q, n)
			}
		}
	}
	for _, want := range []string{"alert GpuletMPSInstanceDown", "alert GpuletGPUFailed", "alert GpuletNodeDegraded", "alert GpuletLeasesOverShare"} {
		if _, ok := queries[want]; !ok {
			t.Errorf("deploy/prometheus: no %s", want)
		}
	}
}

// TestDeployPromtool: promtool accepts the alert rules, and every dashboard
// query parses as PromQL (each checked as a recording rule, the dashboards'
// variables given a value).
func TestDeployPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (make test installs Debian's prometheus):", err)
	}
	if out, err := exec.Command(promtool, "check", "rules", alertRules).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", alertRules, err, out)
	}
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboards\n    rules:\n")
	queries := dashboardQueries(t)
	i := 0
	for _, q := range queries {
		q = strings.NewReplacer("$target", "node:9400", "$node", "n").Replace(q)
		fmt.Fprintf(&rules, "      - record: gpulet:dashboard_query_%d\n        expr: %q\n", i, q)
		i++
	}
	path := filepath.Join(t.TempDir(), "dashboards.yml")
	if err := os.WriteFile(path, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput()
	if want := fmt.Sprintf("SUCCESS: %d rules found", len(queries)); err != nil || !strings.Contains(string(out), want) {
		t.Fatalf("promtool check rules on the dashboards' queries: %v\n%s\n%s", err, out, rules.String())
	}
}
