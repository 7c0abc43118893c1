package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// TestMetricsPassPromtool: gpuletd's /metrics, snapshot part and live part
// together, passes promtool's lint.
func TestMetricsPassPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (Debian's prometheus package; make test installs it as root):", err)
	}
	d := e2e.Start(t)
	if _, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"}); err != nil {
		t.Fatal(err)
	}
	resp, err := d.HTTP().Get("http://gpulet/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"gpulet_units{", "go_goroutines", "process_cpu_seconds_total", "go_build_info", `gpulet_lease_request_duration_seconds_count{result="granted"} 1`} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

// TestPrometheusScrapesListen: a real Prometheus server scrapes gpuletd's
// --listen address and stores its metrics.
func TestPrometheusScrapesListen(t *testing.T) {
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus is not installed (Debian's prometheus package; make test installs it as root):", err)
	}
	target := listenAddr(t, e2e.Start(t, "--listen", anyPort))
	dir := t.TempDir()
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: gpulet\n    static_configs:\n      - targets: [%q]\n", target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	web := freePort(t)
	var logs testutil.SyncBuffer
	cmd := exec.Command(prom, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+web)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	query := func(q string) int {
		resp, err := http.Get("http://" + web + "/api/v1/query?query=" + q)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		var r struct {
			Data struct {
				Result []struct {
					Value []any `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		if json.NewDecoder(resp.Body).Decode(&r) != nil {
			return 0
		}
		return len(r.Data.Result)
	}
	deadline := time.Now().Add(60 * time.Second)
	for query(`up{job="gpulet"}==1`) == 0 || query(`gpulet_units{job="gpulet"}`) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus did not scrape gpuletd within a minute:\n%s", logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}
