package agent

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/flaghelp"
	"github.com/gpulet/gpulet/mpsctl"
	"github.com/gpulet/gpulet/placement"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		check   func(Config) bool
		wantErr string
	}{
		{"defaults", nil, func(c Config) bool {
			return c.Socket == api.DefaultSocket && c.RunDir == DefaultRunDir && c.Mount == "/run/gpulet/view" &&
				c.Model.UnitsPerGPU == 16 && c.Backend == BackendAuto && c.MPS == mpsctl.ModeAuto && c.Policy == placement.BestFit && c.SampleInterval == time.Second && c.MaxUtilization == 90 &&
				c.MaxConnsPerUID == 64 && c.MaxWaitersPerUID == 16 && c.ReclaimGrace == 10*time.Second && c.StateDir == "/var/lib/gpulet"
		}, ""},
		{"reclaim grace", []string{"--reclaim-grace", "250ms"}, func(c Config) bool { return c.ReclaimGrace == 250*time.Millisecond }, ""},
		{"no reclaim grace", []string{"--reclaim-grace", "0s"}, func(c Config) bool { return c.ReclaimGrace == 0 }, ""},
		{"negative reclaim grace", []string{"--reclaim-grace", "-1s"}, nil, "--reclaim-grace -1s: must be between 0s and 1h"},
		{"reclaim grace not a duration", []string{"--reclaim-grace", "10"}, nil, `invalid argument "10" for "--reclaim-grace"`},
		{"per-uid caps", []string{"--max-conns-per-uid", "8", "--max-waiters-per-uid", "2"}, func(c Config) bool { return c.MaxConnsPerUID == 8 && c.MaxWaitersPerUID == 2 }, ""},
		{"no connections", []string{"--max-conns-per-uid", "0"}, nil, "--max-conns-per-uid 0: must be from 1"},
		{"negative waiters", []string{"--max-waiters-per-uid", "-1"}, nil, "--max-waiters-per-uid -1: must be from 1"},
		{"listen", []string{"--listen", "127.0.0.1:9400"}, func(c Config) bool { return c.Listen == "127.0.0.1:9400" }, ""},
		{"listen defaults", nil, func(c Config) bool {
			return !c.ListenFullDetail && c.ListenMaxConns == 512 && c.ListenMaxConnsPerAddr == 32
		}, ""},
		{"listen caps", []string{"--listen-full-detail", "--listen-max-conns", "100", "--listen-max-conns-per-addr", "4"}, func(c Config) bool {
			return c.ListenFullDetail && c.ListenMaxConns == 100 && c.ListenMaxConnsPerAddr == 4
		}, ""},
		{"no listen connections", []string{"--listen-max-conns", "0"}, nil, "--listen-max-conns 0: must be from 1"},
		{"no listen connections per address", []string{"--listen-max-conns-per-addr", "-2"}, nil, "--listen-max-conns-per-addr -2: must be from 1"},
		{"upstreams", []string{"--upstream", "http://a/x", "--upstream", "https://b/y", "--report-interval", "2s"}, func(c Config) bool {
			return len(c.Upstreams) == 2 && c.Upstreams[1].String() == "https://b/y" && c.ReportInterval == 2*time.Second
		}, ""},
		{"upstream not a URL", []string{"--upstream", "scheduler:8080"}, nil, "--upstream \"scheduler:8080\": want an http:// or https:// URL"},
		{"upstream without a path", []string{"--upstream", "http://collector:9410"}, nil, "--upstream http://collector:9410 has no path: gpuletd posts its snapshots to the URL as given; gpulet-collector takes them at /v1/snapshots (http://collector:9410/v1/snapshots)"},
		{"upstream at the root", []string{"--upstream", "https://tok@collector:9410/"}, nil, "--upstream https://redacted@collector:9410/ has no path"},
		{"socket path too long", []string{"--socket", "/" + strings.Repeat("s", 107)}, nil, "--socket /" + strings.Repeat("s", 107) + " is 108 bytes, and a Unix socket path holds at most 107: choose a shorter one"},
		{"upstream cert without key", []string{"--upstream-cert", "/x.pem"}, nil, "--upstream-cert and --upstream-key go together"},
		{"upstream cert and key", []string{"--upstream-cert", "/x.pem", "--upstream-key", "/x.key"}, func(c Config) bool { return c.UpstreamCert == "/x.pem" && c.UpstreamKey == "/x.key" }, ""},
		{"upstream twice but for credentials", []string{"--upstream", "http://u:1@a/x?k=1", "--upstream", "http://u:2@a/x?k=2"}, nil, "--upstream http://redacted@a/x?redacted given twice"},
		{"upstream secrets not echoed", []string{"--upstream", "ftp://u:pw-SECRET@a/x"}, nil, "--upstream \"ftp://redacted@a/x\": want"},
		{"report interval too short", []string{"--report-interval", "1ms"}, nil, "--report-interval 1ms: must be between 100ms and 1h"},
		{"mount follows run dir", []string{"--run-dir", "/tmp/x"}, func(c Config) bool { return c.Mount == "/tmp/x/view" }, ""},
		{"no view", []string{"--mount", ""}, func(c Config) bool { return c.Mount == "" }, ""},
		{"unit model", []string{"--units-per-client", "2", "--clients-per-instance", "4", "--instances-per-gpu", "2"}, func(c Config) bool { return c.Model.UnitsPerGPU == 16 }, ""},
		{"U too big", []string{"--units-per-client", "1", "--units-per-gpu", "17"}, nil, "17 is more than M×N×K"},
		{"defaults: a process may hold a whole GPU", nil, func(c Config) bool { return c.Model == units.Default() && c.Model.UnitsPerClient == 16 }, ""},
		{"M follows U", []string{"--units-per-gpu", "32"}, func(c Config) bool { return c.Model.UnitsPerClient == 32 }, ""},
		{"M zero", []string{"--units-per-client", "0"}, nil, "--units-per-client must be at least 1"},
		{"U not a number", []string{"--units-per-gpu", "lots"}, nil, `invalid argument "lots"`},
		{"sim backend", []string{"--backend", "sim"}, func(c Config) bool { return c.Backend == BackendSim }, ""},
		{"nvml backend", []string{"--backend=nvml"}, func(c Config) bool { return c.Backend == BackendNVML }, ""},
		{"bad backend", []string{"--backend", "cuda"}, nil, `--backend "cuda": must be auto, nvml or sim`},
		{"backend in capitals", []string{"--backend", "NVML"}, nil, `--backend "NVML": must be auto, nvml or sim`},
		{"empty backend", []string{"--backend="}, nil, `--backend "": must be auto, nvml or sim`},
		{"default sim GPUs", nil, func(c Config) bool {
			m := c.SimGPUs.Models
			return c.SimGPUs.Spec == "2xA100-80GB" && len(m) == 2 && m[0].Key == "A100-80GB" && m[1].Key == "A100-80GB"
		}, ""},
		{"sim GPUs parsed once", []string{"--sim-gpus", "1xT4,2xH100"}, func(c Config) bool {
			m := c.SimGPUs.Models
			return c.SimGPUs.Spec == "1xT4,2xH100" && len(m) == 3 && m[0].Key == "T4-16GB" && m[2].Key == "H100-80GB"
		}, ""},
		{"bad sim spec", []string{"--sim-gpus", "3xGTX1080"}, nil, `--sim-gpus item "3xGTX1080": unknown model "GTX1080"; accepted forms`},
		{"empty sim spec", []string{"--sim-gpus", ""}, nil, "--sim-gpus is empty; accepted forms"},
		{"no sim GPUs", []string{"--sim-gpus", "0xT4"}, nil, `--sim-gpus item "0xT4": count must be a whole number of at least 1`},
		{"too many sim GPUs", []string{"--sim-gpus", "40xT4,40xL4"}, nil, `--sim-gpus "40xT4,40xL4": more than 64 GPUs`},
		{"ambiguous sim model", []string{"--sim-gpus", "A100"}, nil, `model "A100" is ambiguous: say which of A100-40GB, A100-80GB`},
		{"mps off", []string{"--mps", "off"}, func(c Config) bool { return c.MPS == mpsctl.ModeOff }, ""},
		{"mps on", []string{"--mps=on"}, func(c Config) bool { return c.MPS == mpsctl.ModeOn }, ""},
		{"bad mps", []string{"--mps", "yes"}, nil, `--mps "yes": want on, off or auto`},
		{"empty mps", []string{"--mps="}, nil, `--mps "": want on, off or auto`},
		{"bad policy", []string{"--policy", "random"}, nil, `--policy "random": must be one of best-fit, first-fit, spread, score, frag`},
		{"score policy", []string{"--policy", "score"}, func(c Config) bool { return c.Policy == placement.Score }, ""},
		{"bad utilization", []string{"--max-utilization", "120"}, nil, "--max-utilization 120"},
		{"bad interval", []string{"--sample-interval", "1ns"}, nil, "--sample-interval 1ns"},
		{"stray argument", []string{"serve"}, nil, `unexpected argument "serve"`},
		{"unknown flag", []string{"--gpus", "2"}, nil, "unknown flag: --gpus"},
		{"kubelet plugin defaults", []string{"--kubelet-plugin"}, func(c Config) bool {
			return c.Kube.Plugin && c.Kube.Dir == "/var/lib/kubelet/device-plugins" && c.Kube.PodResourcesSocket == "/var/lib/kubelet/pod-resources/kubelet.sock" &&
				c.Kube.Interval == 5*time.Second
		}, ""},
		{"kubelet plugin off by default", nil, func(c Config) bool { return !c.Kube.Plugin }, ""},
		{"kubelet flags", []string{"--kubelet-plugin", "--kubelet-dir", "/k/dp", "--pod-resources-socket", "/k/pr.sock", "--pod-resources-interval", "1s"}, func(c Config) bool {
			return c.Kube.Dir == "/k/dp" && c.Kube.PodResourcesSocket == "/k/pr.sock" && c.Kube.Interval == time.Second
		}, ""},
		{"kubelet dir without the plugin", []string{"--kubelet-dir", "/k"}, nil, "--kubelet-dir is for the kubelet plugin: add --kubelet-plugin"},
		{"DRA defaults", []string{"--dra"}, func(c Config) bool {
			return c.Kube.DRA && c.Kube.KubeletRoot == "/var/lib/kubelet" && c.Kube.CDIDir == "/var/run/cdi" && c.Kube.DRAKubeconfig == ""
		}, ""},
		{"DRA flags", []string{"--dra", "--dra-kubelet-dir", "/k", "--cdi-dir", "/etc/cdi", "--dra-kubeconfig", "kc"}, func(c Config) bool {
			return c.Kube.KubeletRoot == "/k" && c.Kube.CDIDir == "/etc/cdi" && c.Kube.DRAKubeconfig == "kc"
		}, ""},
		{"CDI dir without the DRA driver", []string{"--cdi-dir", "/etc/cdi"}, nil, "--cdi-dir is for the DRA driver: add --dra"},
		{"relative CDI dir", []string{"--dra", "--cdi-dir", "cdi"}, nil, `--cdi-dir "cdi": must be an absolute path`},
		{"long DRA kubelet dir", []string{"--dra", "--dra-kubelet-dir", "/" + strings.Repeat("x", 100)}, nil, "--dra-kubelet-dir: the driver's socket"},
		{"relative kubelet dir", []string{"--kubelet-plugin", "--kubelet-dir", "dp"}, nil, `--kubelet-dir "dp/gpulet.sock": must be an absolute path`},
		{"long pod-resources socket", []string{"--kubelet-plugin", "--pod-resources-socket", "/" + strings.Repeat("x", 120)}, nil, "--pod-resources-socket: the socket"},
		{"pod-resources interval too long", []string{"--kubelet-plugin", "--pod-resources-interval", "30s"}, nil, "--pod-resources-interval 30s: must be between 100ms and 5s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseFlags(tc.args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				// A typed flag's error names the flag and the value once.
				if strings.HasPrefix(tc.wantErr, "--") && strings.Contains(err.Error(), "invalid argument") {
					t.Fatalf("err = %v: pflag's prefix says the flag and value twice", err)
				}
				return
			}
			if err != nil || !tc.check(cfg) {
				t.Fatalf("cfg %+v, err %v", cfg, err)
			}
		})
	}
}

func TestHelpListsEveryFlag(t *testing.T) {
	var out strings.Builder
	_, err := ParseFlags([]string{"--help"}, &out)
	if !errors.Is(err, ErrHelp) {
		t.Fatalf("err = %v", err)
	}
	for _, f := range []string{"--socket", "--socket-group", "--run-dir", "--state-dir", "--mount", "--backend", "--sim-gpus", "--units-per-client", "--clients-per-instance", "--instances-per-gpu", "--units-per-gpu", "--max-utilization", "--policy", "--sample-interval", "--node-name", "--admin-group", "--max-conns-per-uid", "--max-waiters-per-uid", "--mps", "--mps-control", "--reclaim-grace", "--kubelet-plugin", "--kubelet-dir", "--pod-resources-socket", "--pod-resources-interval"} {
		if !strings.Contains(out.String(), f) {
			t.Errorf("--help does not mention %s", f)
		}
	}
}

// TestHelpAligned checks the shape of --help and -h: every flag line gives
// a default, and the usages start in one column.
func TestHelpAligned(t *testing.T) {
	for _, arg := range []string{"--help", "-h"} {
		var out strings.Builder
		if _, err := ParseFlags([]string{arg}, &out); !errors.Is(err, ErrHelp) {
			t.Fatalf("%s: err = %v, want ErrHelp", arg, err)
		}
		for _, p := range flaghelp.ShapeProblems(out.String(), gpuletdFlagSet()) {
			t.Errorf("%s: %s", arg, p)
		}
	}
}

func FuzzParseFlags(f *testing.F) {
	for _, s := range []string{"--units-per-gpu 8", "--sim-gpus 1xT4", "--backend sim --policy spread", "--mount=", "--units-per-client 0", "-x",
		"--backend cuda", "--mps=yes --mps off", "--sim-gpus 65xT4", "--sim-gpus=A100,,T4", "--policy="} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		cfg, err := ParseFlags(strings.Fields(line), io.Discard)
		if err != nil {
			return
		}
		m := cfg.Model
		if m.UnitsPerGPU < 1 || m.UnitsPerGPU > m.UnitsPerClient*m.ClientsPerInstance*m.InstancesPerGPU {
			t.Fatalf("accepted unit model %+v", m)
		}
		// The typed flags hold only values their parsers give.
		if _, err := ParseBackend(string(cfg.Backend)); err != nil {
			t.Fatalf("accepted backend %q", cfg.Backend)
		}
		if _, err := mpsctl.ParseMode(string(cfg.MPS)); err != nil {
			t.Fatalf("accepted --mps %q", cfg.MPS)
		}
		if _, err := placement.ParsePolicy(string(cfg.Policy)); err != nil {
			t.Fatalf("accepted policy %q", cfg.Policy)
		}
		if sim, err := ParseSimGPUs(cfg.SimGPUs.Spec); err != nil || !slices.Equal(sim.Models, cfg.SimGPUs.Models) {
			t.Fatalf("sim GPUs %+v do not match their spec (%v)", cfg.SimGPUs, err)
		}
	})
}
