package collector

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/gpulet/gpulet/internal/flaghelp"
	"github.com/gpulet/gpulet/placement"
)

// ErrHelp is returned by ParseFlags after printing --help.
var ErrHelp = pflag.ErrHelp

// flagGroups are gpulet-collector's flags as --help and the flag table of
// docs/collector.md list them: the same headings, the same flags under each,
// in the same order (flagtable_test.go holds all three to one another).
var flagGroups = []flaghelp.Group{
	{Title: "Serving", Flags: []string{"listen", "tls-cert", "tls-key"}},
	{Title: "Credentials", Flags: []string{"node-tokens-file", "token-file", "client-ca", "read-token-file", "learn-tokens-file"}},
	{Title: "Bounds", Flags: []string{"stale-after", "expire-after", "max-nodes", "max-bytes", "max-table-rows", "max-pushes-in-flight", "max-conns", "max-conns-per-addr"}},
	{Title: "Placement", Flags: []string{"policy"}},
}

// ParseFlags parses gpulet-collector's arguments into a Config. --help goes
// to stdout, as asked for (it may be paged), and errors to stderr: an error
// returned has been printed.
func ParseFlags(args []string, stdout, stderr io.Writer) (Config, error) {
	fs := pflag.NewFlagSet("gpulet-collector", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg Config
	policy := defineFlags(fs, &cfg)
	fs.Usage = func() {
		fmt.Fprintln(stdout, "Usage: gpulet-collector --listen ADDR [--node-tokens-file F] [--read-token-file F] [flags]")
		fmt.Fprintln(stdout, "Takes the snapshots gpuletd --upstream pushes and serves one table of every node and GPU.")
		fmt.Fprintln(stdout)
		flaghelp.Write(stdout, fs, flagGroups, nil)
	}
	fail := func(err error) (Config, error) {
		fmt.Fprintln(stderr, "gpulet-collector:", err)
		return Config{}, err
	}
	if err := fs.Parse(args); errors.Is(err, ErrHelp) {
		return Config{}, err
	} else if err != nil {
		return fail(err)
	}
	if fs.NArg() > 0 {
		return fail(fmt.Errorf("unexpected arguments: %v", fs.Args()))
	}
	if cfg.Listen == "" {
		return fail(fmt.Errorf("--listen is required"))
	}
	p, err := placement.ParsePolicy(*policy)
	if err != nil {
		return fail(err)
	}
	cfg.Policy = p
	return cfg, nil
}

// defineFlags defines gpulet-collector's flags on fs, setting cfg; the
// policy is returned as given, to be parsed.
func defineFlags(fs *pflag.FlagSet, cfg *Config) *string {
	fs.StringVar(&cfg.Listen, "listen", "", "TCP address to serve on, e.g. :9410 (required)")
	fs.DurationVar(&cfg.StaleAfter, "stale-after", DefaultStaleAfter, "a node silent this long is not_working (three of its report intervals)")
	fs.IntVar(&cfg.MaxNodes, "max-nodes", DefaultMaxNodes, "most nodes the table keeps; snapshots of further nodes get 503")
	fs.IntVar(&cfg.MaxBytes, "max-bytes", DefaultMaxBytes, "most bytes the table's rows may take (an estimate); snapshots past it get 503")
	fs.DurationVar(&cfg.ExpireAfter, "expire-after", DefaultExpireAfter, "a node silent this long is forgotten, its room in the table freed (at least --stale-after)")
	fs.IntVar(&cfg.MaxTableRows, "max-table-rows", DefaultMaxTableRows, "most rows one answer of GET /v1/table holds; more are read a page at a time (offset, next_offset)")
	fs.IntVar(&cfg.MaxPushesInFlight, "max-pushes-in-flight", DefaultMaxPushesInFlight, "most snapshot bodies read at once, each at most 1 MiB; a push past it waits briefly, then gets 503 with Retry-After")
	fs.IntVar(&cfg.MaxConns, "max-conns", 0, "most connections open at once; more are closed at once (0: as many as the open-files limit allows, less a reserve the collector keeps)")
	fs.IntVar(&cfg.MaxConnsPerAddr, "max-conns-per-addr", 0, "most connections open at once from one remote address (0: no cap; behind a load balancer every node comes from its address)")
	fs.StringVar(&cfg.NodeTokensFile, "node-tokens-file", "", "file of per-node tokens, one \"NODE TOKEN\" line each: a node's snapshots are taken only with its token (read again when it changes)")
	fs.StringVar(&cfg.TokenFile, "token-file", "", "file holding one bearer token every node's snapshots must come with (gpuletd --upstream-token-file); it does not tie a node to its name, --node-tokens-file does")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert", "", "PEM certificate to serve HTTPS with (with --tls-key); plain HTTP by default")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key", "", "PEM key of --tls-cert")
	fs.StringVar(&cfg.ClientCAFile, "client-ca", "", "PEM file of the CA certificates client certificates must chain to: a node's snapshots are then also taken with a certificate whose name is the node's (a DNS name; the common name only in a certificate of no subject alternative names) (gpuletd --upstream-cert); needs --tls-cert")
	policy := fs.String("policy", string(placement.BestFit), "placement policy of POST /v1/placements: best-fit, first-fit, spread, score or frag (the same engine gpuletd places with; frag weighs the mix of the requests it has been asked, GET /v1/placements/mix)")
	fs.StringVar(&cfg.ReadTokenFile, "read-token-file", "", "file holding the bearer token reads (GET /v1/table, /v1/nodes, /v1/placements/mix, /metrics) and placements (POST /v1/placements) must come with (read again when it changes)")
	fs.StringVar(&cfg.LearnTokensFile, "learn-tokens-file", "", "file of per-caller tokens, one \"NAME TOKEN\" line each: placement requests with one are placed (no read token needed) and, once placed, learnt in the request mix of --policy frag as that caller's, each caller's within a share; no other request is learnt (read again when it changes)")
	return policy
}
