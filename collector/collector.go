// Package collector is gpulet's cluster collector (docs/design.md §13): an
// HTTP server that takes the snapshots nodes push (gpuletd --upstream) and
// keeps one resource table of every node and GPU, for schedulers to query.
// It owns the table and nothing else: it keeps nothing on disk, since nodes
// resend their state within one report interval, and it never talks to a
// node.
package collector

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/gpulet/gpulet/internal/connlimit"
	"github.com/gpulet/gpulet/placement"
)

// DefaultStaleAfter is how long a node may be silent before it is
// not_working: three of gpuletd's default 5s report intervals.
const DefaultStaleAfter = 15 * time.Second

// Config is what Run needs.
type Config struct {
	// Listen is the TCP address to serve on (host:port).
	Listen string
	// StaleAfter is how long a node may send nothing before it and its GPUs
	// are not_working.
	StaleAfter time.Duration
	Logger     *slog.Logger
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// MaxNodes is the most nodes the table keeps (--max-nodes).
	MaxNodes int
	// TokenFile holds the bearer token snapshots must come with
	// (--token-file); none when empty. It does not tie a snapshot to its
	// node: NodeTokensFile does.
	TokenFile string
	// NodeTokensFile holds a token per node name (--node-tokens-file); a
	// snapshot of a node is taken only with its token.
	NodeTokensFile string
	// ReadTokenFile holds the bearer token reads must come with
	// (--read-token-file); none when empty.
	ReadTokenFile string
	// LearnTokensFile holds a token per caller whose placement requests
	// the request mix is learnt from (--learn-tokens-file); none when
	// empty, and nothing is learnt.
	LearnTokensFile string
	// MaxBytes bounds the table's memory by estimate (--max-bytes).
	MaxBytes int
	// ExpireAfter is how long a node may be silent before its rows are
	// forgotten (--expire-after).
	ExpireAfter time.Duration
	// MaxTableRows bounds the rows of one answer of GET /v1/table
	// (--max-table-rows).
	MaxTableRows int
	// TLSCertFile and TLSKeyFile, when set, make the collector serve
	// HTTPS (--tls-cert, --tls-key).
	TLSCertFile, TLSKeyFile string
	// Policy is the placement policy of POST /v1/placements (--policy);
	// best-fit when empty.
	Policy placement.Policy
	// ClientCAFile, when set, holds the CA certificates that client
	// certificates are verified against (--client-ca); a node's snapshot
	// may then come with a certificate whose name is the node's.
	ClientCAFile string
	// MaxPushesInFlight bounds the snapshot bodies read at once
	// (--max-pushes-in-flight).
	MaxPushesInFlight int
	// MaxConns and MaxConnsPerAddr cap the connections open at once, all
	// and from one address (--max-conns, --max-conns-per-addr); 0: no
	// cap but the descriptors' limit.
	MaxConns, MaxConnsPerAddr int
}

// fdReserve is how many file descriptors the port leaves to the
// collector's own work (token files read again, the log): a connection that
// arrives with fewer free is closed at once. It is a quarter of the limit
// when that is smaller, so that a collector run with a tiny limit still
// serves some connections.
const fdReserve = 64

func reserve(limit uint64) uint64 { return min(fdReserve, limit/4) }

// Run serves the collector on cfg.Listen until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Listen == "" {
		return errors.New("no address to listen on (--listen)")
	}
	if cfg.StaleAfter <= 0 {
		return fmt.Errorf("--stale-after %v: must be above zero", cfg.StaleAfter)
	}
	if cfg.ExpireAfter < cfg.StaleAfter {
		return fmt.Errorf("--expire-after %v: must be at least --stale-after (%v)", cfg.ExpireAfter, cfg.StaleAfter)
	}
	if cfg.MaxBytes < 1 || cfg.MaxTableRows < 1 || cfg.MaxNodes < 1 || cfg.MaxPushesInFlight < 1 {
		return fmt.Errorf("--max-bytes %d, --max-table-rows %d, --max-nodes %d, --max-pushes-in-flight %d: each must be above zero",
			cfg.MaxBytes, cfg.MaxTableRows, cfg.MaxNodes, cfg.MaxPushesInFlight)
	}
	if cfg.MaxConns < 0 || cfg.MaxConnsPerAddr < 0 {
		return fmt.Errorf("--max-conns %d, --max-conns-per-addr %d: must be 0 (no cap) or above", cfg.MaxConns, cfg.MaxConnsPerAddr)
	}
	if (cfg.TLSCertFile == "") != (cfg.TLSKeyFile == "") || (cfg.ClientCAFile != "" && cfg.TLSCertFile == "") {
		return errors.New("--tls-cert and --tls-key go together, and --client-ca needs them")
	}
	if cfg.TokenFile != "" && cfg.NodeTokensFile != "" {
		return errors.New("--token-file and --node-tokens-file: give one; the node tokens file holds a token for every node")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln, err := listen(cfg, log)
	if err != nil {
		return err
	}
	store := NewStore(cfg.StaleAfter, cfg.Now)
	store.MaxNodes, store.MaxBytes = cfg.MaxNodes, cfg.MaxBytes
	handler := NewServer(store, log)
	handler.MaxTableRows = cfg.MaxTableRows
	handler.SetMaxPushesInFlight(cfg.MaxPushesInFlight)
	if cfg.Policy != "" {
		handler.SetPolicy(cfg.Policy)
	}
	if handler.Auth, err = openAuth(cfg); err != nil {
		ln.Close()
		return err
	}
	srv := HTTPServer(handler)
	if srv.TLSConfig, err = serverTLS(cfg); err != nil {
		ln.Close()
		return err
	}
	handler.Auth.ClientCerts = cfg.ClientCAFile != ""
	warnAuth(log, handler.Auth)
	warnLearn(log, handler.Auth, handler.placer.policy)
	log.Info("gpulet-collector listening", "addr", ln.Addr().String(), "tls", srv.TLSConfig != nil, "client_certs", handler.Auth.ClientCerts,
		"stale_after", cfg.StaleAfter, "expire_after", cfg.ExpireAfter,
		"max_pushes_in_flight", cfg.MaxPushesInFlight, "max_conns", cfg.MaxConns, "max_conns_per_addr", cfg.MaxConnsPerAddr)
	done := make(chan error, 1)
	go func() {
		if srv.TLSConfig != nil {
			done <- srv.ServeTLS(ln, "", "")
			return
		}
		done <- srv.Serve(ln)
	}()
	expire := time.NewTicker(max(cfg.ExpireAfter/10, time.Second))
	defer expire.Stop()
wait:
	for {
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			break wait
		case <-expire.C:
			if n := store.Expire(cfg.ExpireAfter); n > 0 {
				log.Info("forgot nodes silent for --expire-after", "nodes", n, "expire_after", cfg.ExpireAfter)
			}
		}
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdown)
	<-done
	log.Info("gpulet-collector stopped")
	return err
}

// listen listens on cfg.Listen, closing at once the connections past
// --max-conns or --max-conns-per-addr, or that would leave fewer free
// descriptors than the reserve: a flood of connections cannot take the
// descriptors the collector needs. Nodes keep their connections open
// (IdleTimeout), up to --max-nodes of them, and behind a load balancer all
// come from its address: so no cap is set by default, and the descriptors'
// limit is the bound. Accepts are not paced: after a restart every node
// connects again within a report interval.
func listen(cfg Config, log *slog.Logger) (net.Listener, error) {
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, err
	}
	return connlimit.LimitTCP(ln, connlimit.TCPLimits{
		MaxConns: cfg.MaxConns, MaxConnsPerAddr: cfg.MaxConnsPerAddr, Reserve: reserve,
		Port: "--listen", MaxConnsFlag: "--max-conns", MaxConnsPerAddrFlag: "--max-conns-per-addr",
		ReservedFor: "the collector's own work", Log: log,
	}), nil
}

// openAuth opens the token files cfg names.
func openAuth(cfg Config) (Auth, error) {
	var a Auth
	var err error
	for _, f := range []struct {
		flag, path string
		open       func(string) (*WatchedFile, error)
		into       **WatchedFile
	}{
		{"--token-file", cfg.TokenFile, OpenTokenFile, &a.PushToken},
		{"--node-tokens-file", cfg.NodeTokensFile, OpenNodeTokensFile, &a.NodeTokens},
		{"--read-token-file", cfg.ReadTokenFile, OpenTokenFile, &a.ReadToken},
		{"--learn-tokens-file", cfg.LearnTokensFile, OpenCallerTokensFile, &a.LearnTokens},
	} {
		if f.path == "" {
			continue
		}
		if *f.into, err = f.open(f.path); err != nil {
			return Auth{}, fmt.Errorf("%s: %w", f.flag, err)
		}
	}
	return a, nil
}

// serverTLS is the TLS configuration of --tls-cert, --tls-key and
// --client-ca; nil without them.
func serverTLS(cfg Config) (*tls.Config, error) {
	if cfg.TLSCertFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert, --tls-key: %w", err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if cfg.ClientCAFile != "" {
		pem, err := os.ReadFile(cfg.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("--client-ca: %w", err)
		}
		c.ClientCAs = x509.NewCertPool()
		if !c.ClientCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--client-ca %s: no PEM certificate in it", cfg.ClientCAFile)
		}
		// Readers and token holders come without a certificate; one that
		// is given must verify.
		c.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return c, nil
}

// warnAuth says loudly what anyone who reaches the collector may do.
func warnAuth(log *slog.Logger, a Auth) {
	switch {
	case a.NodeTokens != nil, a.ClientCerts && a.PushToken == nil:
	case a.PushToken != nil:
		log.Warn("SECURITY: one --token-file for every node: any node (or anyone with its token) may push snapshots as any other node and replace its rows; give each node its own token with --node-tokens-file")
	default:
		log.Warn("SECURITY: no credentials for pushes: ANYONE who reaches this port may push snapshots as any node, replace its rows and fill the table; give each node its own token with --node-tokens-file")
	}
	if a.ReadToken == nil {
		log.Warn("SECURITY: no --read-token-file: anyone who reaches this port may read the table and the metrics")
	}
}

// warnLearn says, under frag, that without --learn-tokens-file the mix is
// learnt from no one, so that frag places as best-fit.
func warnLearn(log *slog.Logger, a Auth, p placement.Policy) {
	if p == placement.Frag && a.LearnTokens == nil {
		log.Warn("--policy frag with no --learn-tokens-file: placement requests are learnt only from callers named there, so the request mix stays empty and frag places as best-fit; give each scheduler that asks a token of its own")
	}
}

// HTTPServer returns an http.Server for h with timeouts that keep slow or
// idle clients from holding connections.
func HTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		// Over TLS a peer speaks HTTP/2, whose server buffers what a peer
		// sends before any handler reads it, up to its flow-control
		// windows (1 MiB a connection by default), outside
		// --max-pushes-in-flight: the least windows keep that to 64 KiB a
		// connection. A node's snapshot of a few KB fits in one.
		HTTP2: &http.HTTP2Config{MaxReceiveBufferPerConnection: 64 << 10, MaxReceiveBufferPerStream: 64 << 10},
	}
}
