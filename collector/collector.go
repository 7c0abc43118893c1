// Package collector is gpulet's cluster collector (docs/design.md §13): an
// HTTP server that takes the snapshots nodes push (gpuletd --upstream) and
// keeps one resource table of every node and GPU, for schedulers to query.
// It owns the table and nothing else: it keeps nothing on disk, since nodes
// resend their state within one report interval, and it never talks to a
// node.
package collector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
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
	// (--token-file); none when empty.
	TokenFile string
}

// Run serves the collector on cfg.Listen until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Listen == "" {
		return errors.New("no address to listen on (--listen)")
	}
	if cfg.StaleAfter <= 0 {
		return fmt.Errorf("--stale-after %v: must be above zero", cfg.StaleAfter)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	store := NewStore(cfg.StaleAfter, cfg.Now)
	store.MaxNodes = cfg.MaxNodes
	handler := NewServer(store, log)
	if cfg.TokenFile != "" {
		b, err := os.ReadFile(cfg.TokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		if handler.Token = strings.TrimSpace(string(b)); handler.Token == "" || strings.ContainsAny(handler.Token, "\r\n") {
			return errors.New("--token-file: want one line holding the token")
		}
	}
	srv := HTTPServer(handler)
	log.Info("gpulet-collector listening", "addr", ln.Addr().String(), "stale_after", cfg.StaleAfter)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdown)
	<-done
	log.Info("gpulet-collector stopped")
	return err
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
	}
}
