// Package reporter pushes the node's snapshots to upstream receivers
// (--upstream): every report interval, and soon after every change. Each
// upstream has a sender of its own, so a slow or dead one never delays
// another, nor leasing: senders only read published snapshots. A Group
// holds them and publishes how pushing goes (group.go).
package reporter

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/clock"
	"github.com/gpulet/gpulet/internal/filestamp"
	"github.com/gpulet/gpulet/snapshot"
)

// Source is where snapshots come from: the agent's snapshot store.
type Source interface {
	Load() *snapshot.Published
	// Changed is closed at the next change of what Load returns.
	Changed() <-chan struct{}
}

// Config is one upstream's.
type Config struct {
	Upstream Upstream
	// Interval is --report-interval: the longest time between pushes.
	Interval time.Duration
	// TokenFile, when set, holds the bearer token sent with each push; it is
	// read again whenever it changes.
	TokenFile string
	// CAFile, when set, holds the PEM certificates an https upstream's
	// certificate must chain to.
	CAFile string
	// CertFile and KeyFile, when set, hold the PEM client certificate and
	// key presented to an https upstream (a collector with --client-ca
	// takes the node's snapshots by its certificate's name).
	CertFile, KeyFile string
	Logger            *slog.Logger
	// Clock times the pushes (the interval, the gap between pushes, the
	// backoff) and stamps the last success; nil is the system clock. Tests
	// move a fake one to show what does not happen before its time.
	Clock clock.Clock
}

// Timing of a sender: at most one push per minGap (10 a second), a push
// that takes longer than pushTimeout fails, and failures wait from
// backoffMin, doubling, up to backoffMax, each with jitter.
const (
	minGap      = 100 * time.Millisecond
	pushTimeout = 10 * time.Second
	backoffMin  = 200 * time.Millisecond
	backoffMax  = 30 * time.Second
)

// Sender pushes to one upstream.
type Sender struct {
	cfg    Config
	src    Source
	client *http.Client
	log    *slog.Logger

	// shown is the URL as it may be shown (Upstream.String).
	shown string
	// full: push the snapshot with its uids and reservation names, not
	// redacted (fullDetail).
	full bool

	mu     sync.Mutex // guards status and token
	status api.UpstreamStatus
	token  tokenFile
	// published, when set (by a Group), is given each new status, and
	// whether pushing started failing or works again with it.
	published func(st api.UpstreamStatus, stateChanged bool)
}

type tokenFile struct {
	stamp filestamp.Stamp
	value string
}

// New makes a sender for cfg, reading from src. It fails on a CA file that
// cannot be read or holds no certificate.
func New(cfg Config, src Source) (*Sender, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("--upstream-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--upstream-ca %s: no PEM certificate in it", cfg.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	if cfg.CertFile != "" || cfg.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("--upstream-cert, --upstream-key: %w", err)
		}
		if tr.TLSClientConfig == nil {
			tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		tr.TLSClientConfig.Certificates = []tls.Certificate{cert}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	shown := cfg.Upstream.String()
	return &Sender{
		cfg: cfg, src: src, log: cfg.Logger.With("upstream", shown),
		client: &http.Client{Transport: tr, Timeout: pushTimeout,
			// A redirect would re-send the snapshot, and the bearer
			// token, to wherever the answer points.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		status: api.UpstreamStatus{URL: shown},
		shown:  shown,
		// A client certificate is no credential here: only TLS presents
		// it, and an https upstream gets full detail anyway.
		full: cfg.Upstream.fullDetail(cfg.TokenFile != ""),
	}, nil
}

// Status is how pushing goes, now.
func (s *Sender) Status() api.UpstreamStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	if st.LastSuccess != nil {
		t := *st.LastSuccess
		st.LastSuccess = &t
	}
	return st
}

// Run pushes until ctx ends: the newest snapshot, once a report interval
// has passed since the last push or when a snapshot newer than the last one
// pushed exists — at once after a quiet spell, else at most once per minGap,
// what changed meanwhile going out together. A failed push is tried again
// after a backoff, with the newest snapshot of that moment.
func (s *Sender) Run(ctx context.Context) {
	var last *snapshot.Published // the last snapshot pushed
	var lastTry time.Time
	var backoff time.Duration // while failing, the wait before the next try
	for {
		changed := s.src.Changed()
		p := s.src.Load()
		var wait time.Duration
		quiet := false // waiting for the interval: a change ends the wait
		switch {
		case p == nil:
			wait, quiet = s.cfg.Interval, true
		case backoff > 0:
			wait = backoff - s.since(lastTry)
		case last == nil || newer(p, last):
			wait = minGap - s.since(lastTry)
		default:
			wait, quiet = s.cfg.Interval-s.since(lastTry), true
		}
		if wait > 0 {
			fired := make(chan struct{})
			t := s.cfg.Clock.AfterFunc(wait, func() { close(fired) })
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-fired:
				if backoff > 0 {
					// The backoff is over: the next round tries at once.
					lastTry = time.Time{}
				}
			case <-changedIf(quiet, changed):
				t.Stop()
			}
			continue
		}
		lastTry = s.cfg.Clock.Now()
		if err := s.push(ctx, p); err != nil {
			if ctx.Err() != nil {
				return
			}
			// The backoff counts from the end of the try: one that timed
			// out must not be followed by another at once.
			lastTry = s.cfg.Clock.Now()
			backoff = s.failed(err, backoff)
			continue
		}
		last, backoff = p, 0
		s.succeeded(p)
	}
}

// since is the time passed since t on the sender's clock.
func (s *Sender) since(t time.Time) time.Duration { return s.cfg.Clock.Now().Sub(t) }

// changedIf is ch when waiting for the interval, and otherwise a channel
// that never fires: while coalescing or backing off, a change waits for the
// push that ends the wait, which sends the newest snapshot anyway.
func changedIf(quiet bool, ch <-chan struct{}) <-chan struct{} {
	if quiet {
		return ch
	}
	return nil
}

// newer reports whether p is a snapshot the receiver has not seen: a higher
// seq, or another daemon run's.
func newer(p, last *snapshot.Published) bool {
	return api.SnapshotNewer(p.Snapshot.BootID, p.Snapshot.Seq, last.Snapshot.BootID, last.Snapshot.Seq)
}

// push POSTs p.
func (s *Sender) push(ctx context.Context, p *snapshot.Published) error {
	token, err := s.readToken()
	if err != nil {
		return err
	}
	if !s.full {
		p = p.Redacted()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.Upstream.url, bytes.NewReader(p.JSON()))
	if err != nil {
		return s.redactError(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return s.redactError(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 3 {
		return fmt.Errorf("HTTP %d: the upstream redirects; redirects are not followed (set --upstream to the final URL)", resp.StatusCode)
	}
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if strings.EqualFold(resp.Header.Get(api.SnapshotOutcomeHeader), api.SnapshotDropped) {
		return fmt.Errorf("HTTP %d: the upstream dropped the snapshot (seq %d): it holds one of node %q newer than this node sent; is another sender pushing as this node?",
			resp.StatusCode, p.Snapshot.Seq, p.Snapshot.Node)
	}
	return nil
}

// redactError takes the URL, with its credentials, out of an error of the
// HTTP client (which names the URL it tried).
func (s *Sender) redactError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return &url.Error{Op: ue.Op, URL: s.shown, Err: ue.Err}
	}
	return err
}

// readToken returns the bearer token, reading the file again when it
// changed (by its filestamp).
func (s *Sender) readToken() (string, error) {
	if s.cfg.TokenFile == "" {
		return "", nil
	}
	fi, err := os.Stat(s.cfg.TokenFile)
	if err != nil {
		return "", fmt.Errorf("--upstream-token-file: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if filestamp.Of(fi) == s.token.stamp && s.token.value != "" {
		return s.token.value, nil
	}
	b, err := os.ReadFile(s.cfg.TokenFile)
	if err != nil {
		return "", fmt.Errorf("--upstream-token-file: %w", err)
	}
	v := strings.TrimSpace(string(b))
	if v == "" || strings.ContainsAny(v, "\r\n") {
		return "", errors.New("--upstream-token-file: want one line holding the token")
	}
	s.token = tokenFile{stamp: filestamp.Of(fi), value: v}
	return v, nil
}

func (s *Sender) succeeded(p *snapshot.Published) {
	now := s.cfg.Clock.Now().UTC()
	s.mu.Lock()
	recovered := s.status.Failures > 0
	s.status.LastSuccess, s.status.LastSeq = &now, p.Snapshot.Seq
	s.status.LastError, s.status.Failures = "", 0
	s.status.Pushes++
	s.mu.Unlock()
	if recovered {
		s.log.Info("pushing snapshots to the upstream works again")
	}
	s.publish(recovered)
}

// publish hands the sender's status to its Group, if it has one.
func (s *Sender) publish(stateChanged bool) {
	if s.published != nil {
		s.published(s.Status(), stateChanged)
	}
}

// failed records a failed push and returns how long to wait before the next
// try: double the last wait, from backoffMin up to backoffMax, with up to a
// quarter of it as jitter so that many nodes do not retry in step.
func (s *Sender) failed(err error, last time.Duration) time.Duration {
	s.mu.Lock()
	s.status.LastError = err.Error()
	s.status.Failures++
	first := s.status.Failures == 1
	s.mu.Unlock()
	if first {
		s.log.Warn("cannot push the snapshot to the upstream; retrying with backoff (leasing goes on)", "err", err)
	}
	s.publish(first)
	next := min(max(2*last, backoffMin), backoffMax)
	return next + rand.N(next/4+1)
}
