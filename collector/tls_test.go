package collector

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/gpulet/gpulet/internal/testutil"
)

// tlsClient trusts ca and presents the client certificate of name, if any.
func tlsClient(t *testing.T, ca *testutil.CA, name string) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	c := &tls.Config{RootCAs: pool}
	if name != "" {
		certFile, keyFile := ca.Issue(t, name, true)
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: c}}
}

// With --client-ca a node's snapshot comes with a client certificate whose
// name is the node's: another node's certificate, a certificate of another
// CA or none is refused; readers need none.
func TestClientCertificates(t *testing.T) {
	ca, other := testutil.NewCA(t), testutil.NewCA(t)
	certFile, keyFile := ca.Issue(t, "127.0.0.1", false)
	cfg := Config{TLSCertFile: certFile, TLSKeyFile: keyFile, ClientCAFile: ca.File}
	st := NewStore(time.Minute, nil)
	s := NewServer(st, nil)
	s.Auth.ClientCerts = true
	srv := httptest.NewUnstartedServer(s)
	var err error
	if srv.TLS, err = serverTLS(cfg); err != nil {
		t.Fatal(err)
	}
	srv.StartTLS()
	defer srv.Close()
	post := func(c *http.Client, node string, seq uint64) int {
		t.Helper()
		b, _ := json.Marshal(testSnapshot(node, "b", seq, 4, 1))
		resp, err := c.Post(srv.URL+"/v1/snapshots", "application/json", bytes.NewReader(b))
		if err != nil {
			return -1 // the handshake refused the certificate
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	n1 := tlsClient(t, ca, "n1")
	if code := post(n1, "n1", 1); code != 204 {
		t.Fatalf("n1 with its certificate: %d", code)
	}
	if code := post(n1, "n2", 1); code != 403 {
		t.Fatalf("n1's certificate pushing as n2: %d, want 403", code)
	}
	if code := post(tlsClient(t, ca, ""), "n1", 2); code != 403 {
		t.Fatalf("no certificate, no token: %d, want 403", code)
	}
	if code := post(tlsClient(t, other, "n1"), "n1", 3); code == 204 {
		t.Fatal("a certificate of another CA was taken")
	}
	resp, err := tlsClient(t, ca, "").Get(srv.URL + "/v1/table")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("a reader without a certificate: %v %v", resp, err)
	}
	resp.Body.Close()
	if n := st.Nodes().Nodes; len(n) != 1 || n[0].Seq != 1 {
		t.Fatalf("table %+v", n)
	}
}

func TestServerTLSConfigErrors(t *testing.T) {
	ca := testutil.NewCA(t)
	certFile, keyFile := ca.Issue(t, "127.0.0.1", false)
	for _, cfg := range []Config{
		{TLSCertFile: certFile, TLSKeyFile: certFile},
		{TLSCertFile: certFile, TLSKeyFile: keyFile, ClientCAFile: keyFile},
		{TLSCertFile: certFile, TLSKeyFile: keyFile, ClientCAFile: "/nonexistent"},
	} {
		if _, err := serverTLS(cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}

// Over TLS nodes push with HTTP/2, whose server is given the least receive
// windows (64 KiB a connection: what a peer may send before a handler reads
// it), and a push of a few KB still goes through.
func TestHTTP2PushWithSmallWindows(t *testing.T) {
	ca := testutil.NewCA(t)
	certFile, keyFile := ca.Issue(t, "127.0.0.1", false)
	st := NewStore(time.Minute, nil)
	hs := HTTPServer(NewServer(st, nil))
	if c := hs.HTTP2; c == nil || c.MaxReceiveBufferPerConnection != 64<<10 || c.MaxReceiveBufferPerStream != 64<<10 {
		t.Fatalf("HTTP/2 config %+v, want receive windows of 64 KiB", c)
	}
	srv := httptest.NewUnstartedServer(hs.Handler)
	srv.Config = hs
	var err error
	if srv.TLS, err = serverTLS(Config{TLSCertFile: certFile, TLSKeyFile: keyFile}); err != nil {
		t.Fatal(err)
	}
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	c := tlsClient(t, ca, "")
	c.Transport.(*http.Transport).ForceAttemptHTTP2 = true
	b, _ := json.Marshal(testSnapshot("n1", "b", 1, 4, 8))
	resp, err := c.Post(srv.URL+"/v1/snapshots", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 204 || resp.ProtoMajor != 2 {
		t.Fatalf("a push of %d bytes over TLS: %s %s, want 204 over HTTP/2", len(b), resp.Proto, resp.Status)
	}
	if n := st.Nodes().Nodes; len(n) != 1 {
		t.Fatalf("table %+v", n)
	}
}
