package reporter

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/snapshot"
)

// bodies records the bodies pushed to it and answers with answer.
type bodies struct {
	mu     sync.Mutex
	got    []string
	answer func(w http.ResponseWriter)
}

func (b *bodies) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	b.mu.Lock()
	b.got = append(b.got, string(raw))
	b.mu.Unlock()
	if b.answer != nil {
		b.answer(w)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (b *bodies) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.got)
}

func TestRedactURL(t *testing.T) {
	for raw, want := range map[string]string{
		"http://user:pw@host:8080/path?api_key=K": "http://redacted@host:8080/path?redacted",
		"https://host/v1/snapshots":               "https://host/v1/snapshots",
		"http://tok@host/x?":                      "http://redacted@host/x",
		"http://host/x#frag":                      "http://host/x",
		"http://host/x?a=1&b=2":                   "http://host/x?redacted",
		"http://%zz":                              "(unparsable URL)",
	} {
		if got := RedactURL(raw); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", raw, got, want)
		}
	}
}

func FuzzRedactURL(f *testing.F) {
	for _, s := range []string{"http://user:pw@host/p?k=v", "https://h", "http://%zz", "http://a@b@c/?x#y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		shown := RedactURL(raw)
		u, err := url.Parse(shown)
		if err != nil {
			if shown != "(unparsable URL)" {
				t.Fatalf("%q shown as %q, which does not parse", raw, shown)
			}
			return
		}
		if (u.User != nil && u.User.String() != "redacted") || (u.RawQuery != "" && u.RawQuery != "redacted") {
			t.Fatalf("%q shown as %q: userinfo or query kept", raw, shown)
		}
	})
}

// An upstream URL's userinfo and query appear in no status, log or error:
// not while pushing works, nor in the error of a failed push.
func TestUpstreamSecretsAreRedacted(t *testing.T) {
	rcv := &bodies{}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skip("no loopback TCP:", err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there: pushes fail with the client's error
	src := newSource()
	secretURL := strings.Replace(srv.URL, "http://", "http://user:pw-SECRET@", 1) + "/v1/snapshots?api_key=KEY-SECRET"
	ok := start(t, Config{Upstream: mustUpstream(t, secretURL), Interval: 100 * time.Millisecond}, src)
	failing := start(t, Config{Upstream: mustUpstream(t, "http://user:pw-SECRET@"+dead+"/p?api_key=KEY-SECRET"), Interval: 100 * time.Millisecond}, src)
	testutil.Eventually(t, "a push", func() bool { return rcv.count() >= 1 })
	testutil.Eventually(t, "a failed push", func() bool { return failing.Status().Failures >= 1 })
	for _, st := range []api.UpstreamStatus{ok.Status(), failing.Status()} {
		if strings.Contains(st.URL+st.LastError, "SECRET") {
			t.Fatalf("a secret of the URL shows: %+v", st)
		}
		if !strings.Contains(st.URL, "redacted@") || !strings.HasSuffix(st.URL, "?redacted") {
			t.Fatalf("URL shown as %q", st.URL)
		}
	}
	if !strings.Contains(failing.Status().LastError, "redacted@"+dead) {
		t.Fatalf("the failed push's error does not say where: %q", failing.Status().LastError)
	}
}

// A push answered with a redirect is not sent again elsewhere: the snapshot
// and its bearer token stay with the upstream configured, and the push
// counts as failed.
func TestPushDoesNotFollowRedirects(t *testing.T) {
	elsewhere := &bodies{}
	other := httptest.NewServer(elsewhere)
	defer other.Close()
	redirector := &bodies{answer: func(w http.ResponseWriter) {
		w.Header().Set("Location", other.URL+"/stolen")
		w.WriteHeader(http.StatusTemporaryRedirect)
	}}
	srv := httptest.NewServer(redirector)
	defer srv.Close()
	s := start(t, Config{Upstream: mustUpstream(t, srv.URL), Interval: 100 * time.Millisecond}, newSource())
	testutil.Eventually(t, "a failed push", func() bool { return s.Status().Failures >= 2 })
	if n := elsewhere.count(); n != 0 {
		t.Fatalf("the redirect was followed: %d pushes elsewhere", n)
	}
	if st := s.Status(); !strings.Contains(st.LastError, "HTTP 307") || !strings.Contains(st.LastError, "not followed") {
		t.Fatalf("status %+v", st)
	}
}

// A receiver that answers 2xx but says it dropped the snapshot (the
// collector holds a newer one of this node: someone else pushes as it) makes
// the push fail where the node shows it.
func TestDroppedPushIsAFailure(t *testing.T) {
	rcv := &bodies{answer: func(w http.ResponseWriter) {
		w.Header().Set(api.SnapshotOutcomeHeader, api.SnapshotDropped)
		w.WriteHeader(http.StatusNoContent)
	}}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	s := start(t, Config{Upstream: mustUpstream(t, srv.URL), Interval: 100 * time.Millisecond}, newSource())
	testutil.Eventually(t, "a failed push", func() bool { return s.Status().Failures >= 1 })
	if st := s.Status(); !strings.Contains(st.LastError, "dropped") || st.Pushes != 0 {
		t.Fatalf("status %+v", st)
	}
}

// uidSource publishes a snapshot with a user's uid and a reservation name.
type uidSource struct{ store snapshot.Store }

func (u *uidSource) Load() *snapshot.Published { return u.store.Load() }
func (u *uidSource) Changed() <-chan struct{}  { return u.store.Changed() }

// Full detail goes only to an upstream reached with credentials or over
// TLS; a plain one gets the snapshot redacted, even when gpuletd has a client
// certificate, which only TLS presents.
func TestPushRedactedWithoutCredentials(t *testing.T) {
	uid := uint32(4242)
	src := &uidSource{}
	src.store.Store(snapshot.New(&api.Snapshot{Schema: api.SnapshotSchema, Node: "n1", BootID: "b", Seq: 1,
		GPUs:         []api.GPU{{Index: 0, OfflineByUID: map[string]int{"4242": 1}, Instances: []api.Instance{{UID: &uid}}}},
		Reservations: []api.ReservationStatus{{Name: "secret-project"}}}, nil, nil))
	plain, withToken, overTLS, plainWithCert := &bodies{}, &bodies{}, &bodies{}, &bodies{}
	ca := testutil.NewCA(t)
	certFile, keyFile := ca.Issue(t, "n1", true)
	for _, c := range []struct {
		rcv   *bodies
		tls   bool
		token bool
		cert  bool
	}{{plain, false, false, false}, {withToken, false, true, false}, {overTLS, true, false, false}, {plainWithCert, false, false, true}} {
		srv := httptest.NewServer(c.rcv)
		cfg := Config{Upstream: mustUpstream(t, srv.URL), Interval: 100 * time.Millisecond}
		if c.tls {
			srv.Close()
			srv = httptest.NewTLSServer(c.rcv)
			ca := filepath.Join(t.TempDir(), "ca.pem")
			writePEM(t, ca, srv)
			cfg = Config{Upstream: mustUpstream(t, srv.URL), Interval: 100 * time.Millisecond, CAFile: ca}
		}
		defer srv.Close()
		if c.token {
			cfg.TokenFile = filepath.Join(t.TempDir(), "token")
			os.WriteFile(cfg.TokenFile, []byte("t\n"), 0o600)
		}
		if c.cert {
			cfg.CertFile, cfg.KeyFile = certFile, keyFile
		}
		start(t, cfg, src)
	}
	for name, rcv := range map[string]*bodies{"plain": plain, "token": withToken, "tls": overTLS, "plain with a client certificate": plainWithCert} {
		testutil.Eventually(t, "a push to "+name, func() bool { return rcv.count() >= 1 })
		rcv.mu.Lock()
		body := rcv.got[0]
		rcv.mu.Unlock()
		secret := strings.Contains(body, "4242") || strings.Contains(body, "secret-project")
		if secret != (rcv != plain && rcv != plainWithCert) {
			t.Errorf("%s upstream: full detail %v:\n%s", name, secret, body)
		}
	}
}

func writePEM(t *testing.T, path string, srv *httptest.Server) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A client certificate is presented to an https upstream that asks for one.
func TestPushClientCertificate(t *testing.T) {
	ca := testutil.NewCA(t)
	rcv := &bodies{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || r.TLS.VerifiedChains[0][0].Subject.CommonName != "n1" {
			http.Error(w, "who are you", http.StatusForbidden)
			return
		}
		rcv.ServeHTTP(w, r)
	}))
	pem, _ := os.ReadFile(ca.File)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	serverCert, serverKey := ca.Issue(t, "127.0.0.1", false)
	cert, err := tls.LoadX509KeyPair(serverCert, serverKey)
	if err != nil {
		t.Fatal(err)
	}
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	defer srv.Close()
	certFile, keyFile := ca.Issue(t, "n1", true)
	start(t, Config{Upstream: mustUpstream(t, srv.URL), Interval: time.Hour, CAFile: ca.File, CertFile: certFile, KeyFile: keyFile}, newSource())
	without := start(t, Config{Upstream: mustUpstream(t, srv.URL), Interval: time.Hour, CAFile: ca.File}, newSource())
	testutil.Eventually(t, "a push with the client certificate", func() bool { return rcv.count() >= 1 })
	testutil.Eventually(t, "the sender without one failing", func() bool { return without.Status().Failures >= 1 })
	if _, err := New(Config{Upstream: mustUpstream(t, srv.URL), CertFile: certFile, KeyFile: serverCert}, newSource()); err == nil {
		t.Fatal("a key that is no key was accepted")
	}
}
