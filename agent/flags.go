package agent

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/gpulet/gpulet/agent/inventory"
	"github.com/gpulet/gpulet/agent/reporter"
	"github.com/gpulet/gpulet/agent/server"
	"github.com/gpulet/gpulet/agent/units"
	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/flaghelp"
	"github.com/gpulet/gpulet/mpsctl"
	"github.com/gpulet/gpulet/placement"
)

// DefaultRunDir is --run-dir's default (docs/design.md §10).
const DefaultRunDir = "/run/gpulet"

// ErrHelp is returned by ParseFlags after printing --help.
var ErrHelp = pflag.ErrHelp

// ParseFlags parses gpuletd's arguments into a Config. Usage and errors go to
// out. Every bad value gives an error naming the flag and the value; the
// flags with a fixed set of values or a syntax of their own (--backend,
// --sim-gpus, --mps, --policy, --upstream) are parsed here, once, into the
// typed fields the rest of gpuletd reads.
func ParseFlags(args []string, out io.Writer) (Config, error) {
	fs := pflag.NewFlagSet("gpuletd", pflag.ContinueOnError)
	fs.SetOutput(out)
	var (
		cfg Config
		raw rawFlags
	)
	defineFlags(fs, &cfg, &raw)
	fs.Usage = func() {
		fmt.Fprintf(out, "gpuletd shares this host's NVIDIA GPUs as units leased over a Unix-socket API.\n\nUsage: gpuletd [flags]\n\n")
		flaghelp.Write(out, fs, gpuletdFlagGroups, gpuletdComputedDefaults)
	}
	if err := fs.Parse(args); err != nil {
		return Config{}, typedFlagError(err)
	}
	return checkFlags(fs, cfg, raw)
}

// rawFlags are the flags that make a Config field together or whose
// default depends on another: checkFlags makes the field.
type rawFlags struct {
	m, n, k, u int
	mount      string
}

// defineFlags defines gpuletd's flags on fs, in the order of
// gpuletdFlagGroups, setting cfg and raw.
func defineFlags(fs *pflag.FlagSet, cfg *Config, raw *rawFlags) {
	host, _ := os.Hostname()
	// Socket and state
	fs.StringVar(&cfg.Socket, "socket", api.DefaultSocket, "API socket (systemd socket activation overrides it)")
	fs.StringVar(&cfg.SocketGroup, "socket-group", "gpulet", "group that owns the socket (mode 0660) and the ledger's instance folders (1770: who may claim offline); a warning if it does not exist")
	fs.StringVar(&cfg.RunDir, "run-dir", DefaultRunDir, "state that survives a daemon restart but not a reboot: pipe-file ledger, lease journal")
	fs.StringVar(&cfg.StateDir, "state-dir", "/var/lib/gpulet", "state that survives a reboot, written with fsync: workflow reservations")
	fs.StringVar(&raw.mount, "mount", "", "FUSE view mount point (\"\" for none)")
	// GPUs
	typedVar(fs, &cfg.Backend, "backend", string(BackendAuto), ParseBackend, "GPU backend: nvml, sim, or auto (NVML when it initializes, else simulated)")
	typedVar(fs, &cfg.SimGPUs, "sim-gpus", "2xA100-80GB", ParseSimGPUs, "simulated GPUs, COUNTxMODEL[,...]; models: "+strings.Join(inventory.ModelKeys(), ", ")+" (the memory suffix may be left out where only one size exists)")
	// Units
	fs.IntVar(&raw.m, "units-per-client", 0, "M: most units one process may hold (U, a whole GPU, unless given; a lease still lies on one MPS instance, U/K units at most)")
	fs.IntVar(&raw.n, "clients-per-instance", 16, "N: most processes one MPS instance serves at once")
	fs.IntVar(&raw.k, "instances-per-gpu", 1, "K: MPS control daemons per GPU; more let more users run at once, each instance serving one user at a time")
	fs.IntVar(&raw.u, "units-per-gpu", 0, "U: units per GPU, at most M×N×K; a unit is 1/U of the GPU's memory and SMs (M×N×K when --units-per-client is given and this is not)")
	// Placement and sampling
	fs.IntVar(&cfg.MaxUtilization, "max-utilization", 90, "percent of a GPU's SMs in use (GPM, else per-process SM figures; never the time any kernel ran) above which it takes no new leases")
	typedVar(fs, &cfg.Policy, "policy", string(placement.BestFit), placement.ParsePolicy, "placement policy: best-fit, first-fit, spread, score (the strongest card whose free resources are shaped most like the request), or frag (the choice that fragments the node least over the mix of the requests it has been receiving, learned from the first request on)")
	fs.DurationVar(&cfg.SampleInterval, "sample-interval", time.Second, "how often utilization and memory are sampled")
	fs.BoolVar(&cfg.Accounting, "accounting", true, "at every sample, attribute the GPU's processes and their memory to leases, offline claims and processes beside gpulet (--accounting=false: leases show no usage)")
	// Node, admins and config
	fs.StringVar(&cfg.NodeName, "node-name", host, "the node's name in snapshots")
	fs.StringVar(&cfg.AdminGroup, "admin-group", "", "group whose members act as admins on the API (they may use every pool and are bound by no quota)")
	fs.BoolVar(&cfg.PrivateLeases, "private-leases", false, "show users who are not admins only their own leases, even with gpulet leases --all (by default each sees every lease's user, GPU, units and command, never its id or environment)")
	fs.StringVar(&cfg.ConfigPath, "config", "", "YAML file of pools, quotas, task profiles and score weights (checked at start; SIGHUP reloads it, keeping the old one if the new one is bad)")
	// Pushing to upstreams
	fs.Var(&upstreamsFlag{list: &cfg.Upstreams}, "upstream", "URL (http or https) that receives the node's snapshots by POST; repeatable, each upstream pushed to on its own")
	fs.DurationVar(&cfg.ReportInterval, "report-interval", 5*time.Second, "longest time between pushes to an upstream (changes go out at once, at most 10 a second)")
	fs.StringVar(&cfg.UpstreamTokenFile, "upstream-token-file", "", "file holding a bearer token sent to upstreams (read again when it changes)")
	fs.StringVar(&cfg.UpstreamCert, "upstream-cert", "", "PEM client certificate presented to https upstreams (with --upstream-key): gpulet-collector --client-ca takes the node's snapshots by its name")
	fs.StringVar(&cfg.UpstreamKey, "upstream-key", "", "PEM key of --upstream-cert")
	fs.StringVar(&cfg.UpstreamCA, "upstream-ca", "", "PEM file of the CA certificates an https upstream must chain to; without it, the system's")
	// Read-only TCP endpoint
	fs.StringVar(&cfg.Listen, "listen", "", "TCP address (host:port) serving only GET /v1/snapshot, /v1/gpus and /metrics, for pollers, redacted (no uids, no reservation names)")
	fs.BoolVar(&cfg.ListenFullDetail, "listen-full-detail", false, "serve the snapshot over --listen with the uids of GPU users and the reservation names, as the Unix socket does")
	fs.IntVar(&cfg.ListenMaxConns, "listen-max-conns", server.DefaultTCPMaxConns, "most TCP connections open at once over --listen; more are closed at once (the Unix socket keeps descriptors of its own whatever TCP holds)")
	fs.IntVar(&cfg.ListenMaxConnsPerAddr, "listen-max-conns-per-addr", server.DefaultTCPMaxConnsPerAddr, "most TCP connections open at once over --listen from one remote address")
	// Limits per uid
	fs.IntVar(&cfg.MaxConnsPerUID, "max-conns-per-uid", 64, "most API connections one uid may hold open; more are closed at once (root is not capped)")
	fs.IntVar(&cfg.MaxWaitersPerUID, "max-waiters-per-uid", 16, "most lease requests one uid may have waiting for units (\"wait\"); more get too_many_requests (root is not capped)")
	// MPS
	typedVar(fs, &cfg.MPS, "mps", string(mpsctl.ModeAuto), mpsctl.ParseMode, "MPS: on (refuse to start when MPS cannot run: no control binary, a run dir too long, no control daemon starting), off, or auto (on where MPS works, else off with the reason logged)")
	fs.StringVar(&cfg.MPSControl, "mps-control", "nvidia-cuda-mps-control", "the MPS control binary (looked up in PATH)")
	// Reservations
	fs.DurationVar(&cfg.ReclaimGrace, "reclaim-grace", 10*time.Second, "time between SIGTERM and SIGKILL for a borrower whose units a reservation takes back (0s to 1h)")
	// Kubernetes
	kubeFlags(fs, &cfg.Kube)
}

// checkFlags checks the values of the parsed flags, alone and together, and
// makes the Config fields that several flags set.
func checkFlags(fs *pflag.FlagSet, cfg Config, raw rawFlags) (Config, error) {
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q (gpuletd takes only flags; see --help)", fs.Arg(0))
	}
	if len(cfg.Socket) > api.MaxSocketPath {
		return Config{}, fmt.Errorf("--socket %s is %d bytes, and a Unix socket path holds at most %d: choose a shorter one", cfg.Socket, len(cfg.Socket), api.MaxSocketPath)
	}
	if fs.Changed("units-per-client") && raw.m < 1 {
		return Config{}, fmt.Errorf("--units-per-client must be at least 1, got %d", raw.m)
	}
	if fs.Changed("units-per-gpu") && raw.u < 1 {
		return Config{}, fmt.Errorf("--units-per-gpu must be at least 1, got %d", raw.u)
	}
	var err error
	if cfg.Model, err = units.New(raw.m, raw.n, raw.k, raw.u); err != nil {
		return Config{}, err
	}
	if (cfg.UpstreamCert == "") != (cfg.UpstreamKey == "") {
		return Config{}, fmt.Errorf("--upstream-cert and --upstream-key go together")
	}
	if cfg.ReportInterval < 100*time.Millisecond || cfg.ReportInterval > time.Hour {
		return Config{}, fmt.Errorf("--report-interval %s: must be between 100ms and 1h", cfg.ReportInterval)
	}
	if cfg.MaxUtilization < 0 || cfg.MaxUtilization > 100 {
		return Config{}, fmt.Errorf("--max-utilization %d: must be a percentage from 0 to 100", cfg.MaxUtilization)
	}
	for _, f := range []struct {
		name string
		v    int
	}{
		{"--max-conns-per-uid", cfg.MaxConnsPerUID}, {"--max-waiters-per-uid", cfg.MaxWaitersPerUID},
		{"--listen-max-conns", cfg.ListenMaxConns}, {"--listen-max-conns-per-addr", cfg.ListenMaxConnsPerAddr},
	} {
		if f.v < 1 || f.v > 1<<20 {
			return Config{}, fmt.Errorf("%s %d: must be from 1 to %d", f.name, f.v, 1<<20)
		}
	}
	if cfg.ReclaimGrace < 0 || cfg.ReclaimGrace > time.Hour {
		return Config{}, fmt.Errorf("--reclaim-grace %s: must be between 0s and 1h", cfg.ReclaimGrace)
	}
	if cfg.SampleInterval < 10*time.Millisecond || cfg.SampleInterval > time.Hour {
		return Config{}, fmt.Errorf("--sample-interval %s: must be between 10ms and 1h", cfg.SampleInterval)
	}
	for _, f := range []struct{ name, v string }{{"--socket", cfg.Socket}, {"--run-dir", cfg.RunDir}, {"--state-dir", cfg.StateDir}, {"--node-name", cfg.NodeName}} {
		if f.v == "" {
			return Config{}, fmt.Errorf("%s must not be empty", f.name)
		}
	}
	if err := checkKubeFlags(fs, cfg.Kube); err != nil {
		return Config{}, err
	}
	cfg.Mount = raw.mount
	if !fs.Changed("mount") {
		cfg.Mount = cfg.RunDir + "/view"
	}
	return cfg, nil
}

// typedFlag is a flag whose text is parsed into the typed field it sets when
// it is given, so that the rest of gpuletd reads the field and never checks
// the text again. Its parse function's errors name the flag and the value
// (see typedFlagError).
type typedFlag[T any] struct {
	field *T
	text  string
	parse func(string) (T, error)
}

func (f *typedFlag[T]) Set(s string) error {
	v, err := f.parse(s)
	if err != nil {
		return err
	}
	*f.field, f.text = v, s
	return nil
}

func (f *typedFlag[T]) String() string { return f.text }

// Type is the word --help shows for the value: each such flag is written
// as a string.
func (f *typedFlag[T]) Type() string { return "string" }

// namesItsFlag marks a flag.Value whose Set errors name the flag already.
func (f *typedFlag[T]) namesItsFlag() {}

// typedVar defines a typedFlag. Its default is parsed too, so that a default
// the parser refuses fails every test rather than a start.
func typedVar[T any](fs *pflag.FlagSet, field *T, name, def string, parse func(string) (T, error), usage string) {
	v, err := parse(def)
	if err != nil {
		panic(fmt.Sprintf("--%s: default %q: %v", name, def, err))
	}
	*field = v
	fs.Var(&typedFlag[T]{field: field, text: def, parse: parse}, name, usage)
}

// upstreamsFlag is --upstream, repeatable: each URL is parsed when given.
// Upstreams are told apart where they are shown (status, metrics) by their
// redacted URL, so two that read the same there are refused.
type upstreamsFlag struct{ list *[]reporter.Upstream }

func (f *upstreamsFlag) Set(s string) error {
	u, err := reporter.ParseUpstream(s)
	if err != nil {
		return err
	}
	// gpuletd POSTs to the URL as given: one without a path reaches no
	// receiver's route, and pushes would fail with 404 for as long as it runs.
	if p, err := url.Parse(s); err == nil && (p.Path == "" || p.Path == "/") {
		return fmt.Errorf("--upstream %s has no path: gpuletd posts its snapshots to the URL as given; gpulet-collector takes them at /v1/snapshots (%s://%s/v1/snapshots)", u, p.Scheme, p.Host)
	}
	for _, have := range *f.list {
		if have.String() == u.String() {
			return fmt.Errorf("--upstream %s given twice (the URLs differ at most in userinfo or query)", u)
		}
	}
	*f.list = append(*f.list, u)
	return nil
}

// String is the list as pflag writes a string array's, each URL redacted.
func (f *upstreamsFlag) String() string {
	shown := make([]string, len(*f.list))
	for i, u := range *f.list {
		shown[i] = u.String()
	}
	return "[" + strings.Join(shown, ",") + "]"
}

// Type is the word --help shows for the value, a string array's.
func (f *upstreamsFlag) Type() string { return "stringArray" }

func (f *upstreamsFlag) namesItsFlag() {}

// typedFlagError returns the parser's own error for a bad value of a typed
// flag, without pflag's "invalid argument V for "--F" flag:" before it,
// which would name the flag and the value a second time.
func typedFlagError(err error) error {
	var bad *pflag.InvalidValueError
	if errors.As(err, &bad) {
		if _, ok := bad.GetFlag().Value.(interface{ namesItsFlag() }); ok {
			return bad.Unwrap()
		}
	}
	return err
}
