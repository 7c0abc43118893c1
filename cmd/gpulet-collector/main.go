// Command gpulet-collector keeps one resource table of the nodes that push
// their snapshots to it. See package collector.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/gpulet/gpulet/collector"
	"github.com/gpulet/gpulet/placement"
)

func main() {
	// Signals are caught first, so that a SIGTERM at any time stops cleanly.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	fs := pflag.NewFlagSet("gpulet-collector", pflag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	var cfg collector.Config
	fs.StringVar(&cfg.Listen, "listen", "", "TCP address to serve on, e.g. :9410 (required)")
	fs.DurationVar(&cfg.StaleAfter, "stale-after", collector.DefaultStaleAfter, "a node silent this long is not_working (three of its report intervals)")
	fs.IntVar(&cfg.MaxNodes, "max-nodes", collector.DefaultMaxNodes, "most nodes the table keeps; snapshots of further nodes get 503")
	fs.IntVar(&cfg.MaxBytes, "max-bytes", collector.DefaultMaxBytes, "most bytes the table's rows may take (an estimate); snapshots past it get 503")
	fs.DurationVar(&cfg.ExpireAfter, "expire-after", collector.DefaultExpireAfter, "a node silent this long is forgotten, its room in the table freed (at least --stale-after)")
	fs.IntVar(&cfg.MaxTableRows, "max-table-rows", collector.DefaultMaxTableRows, "most rows one answer of GET /v1/table holds; more are read a page at a time (offset, next_offset)")
	fs.StringVar(&cfg.NodeTokensFile, "node-tokens-file", "", "file of per-node tokens, one \"NODE TOKEN\" line each: a node's snapshots are taken only with its token (read again when it changes)")
	fs.StringVar(&cfg.TokenFile, "token-file", "", "file holding one bearer token every node's snapshots must come with (gpuletd --upstream-token-file); it does not tie a node to its name, --node-tokens-file does; none by default")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert", "", "PEM certificate to serve HTTPS with (with --tls-key); plain HTTP by default")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key", "", "PEM key of --tls-cert")
	fs.StringVar(&cfg.ClientCAFile, "client-ca", "", "PEM file of the CA certificates client certificates must chain to: a node's snapshots are then also taken with a certificate whose name (DNS name or common name) is the node's (gpuletd --upstream-cert); needs --tls-cert")
	policy := fs.String("policy", string(placement.BestFit), "placement policy of POST /v1/placements: best-fit, first-fit, spread, score or frag (the same engine gpuletd places with)")
	fs.StringVar(&cfg.ReadTokenFile, "read-token-file", "", "file holding the bearer token reads (GET /v1/table, /v1/nodes, /metrics) must come with (read again when it changes); none by default")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: gpulet-collector --listen ADDR [--node-tokens-file F] [--read-token-file F] [flags]")
		fmt.Fprintln(fs.Output(), "Takes the snapshots gpuletd --upstream pushes and serves one table of every node and GPU.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return
		}
		os.Exit(2)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "gpulet-collector: unexpected arguments: %v\n", fs.Args())
		os.Exit(2)
	}
	if cfg.Listen == "" {
		fmt.Fprintln(os.Stderr, "gpulet-collector: --listen is required")
		os.Exit(2)
	}
	p, err := placement.ParsePolicy(*policy)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpulet-collector:", err)
		os.Exit(2)
	}
	cfg.Policy = p
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := collector.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "gpulet-collector:", err)
		os.Exit(1)
	}
}
