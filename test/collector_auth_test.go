package test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// hijack posts node's current snapshot, with the node's boot_id, seq
// 2^64-1 and a poisoned GPU name, as an outsider would; auth is its
// Authorization header.
func hijack(t *testing.T, base string, d *e2e.Daemon, auth string) int {
	t.Helper()
	s, err := d.Client.Snapshot(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	s.Seq = 1<<64 - 1
	s.GPUs[0].Name = "POISON"
	b, _ := json.Marshal(s)
	req, _ := http.NewRequest("POST", base+"/v1/snapshots", bytes.NewReader(b))
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func poisoned(t *testing.T, base string) bool {
	for _, r := range collectorRows(t, base, "node=n1") {
		if r.Name == "POISON" {
			return true
		}
	}
	return false
}

// TestCollectorHijackIsSeen: a collector without per-node credentials lets
// anyone replace a node's rows with a higher seq; the node's pushes are then
// dropped, and now the node sees it: gpulet status, the snapshot's upstreams
// and the metrics say its pushes fail.
func TestCollectorHijackIsSeen(t *testing.T) {
	base := startCollector(t, "5s")
	d := e2e.Start(t, "--upstream", base+"/v1/snapshots", "--report-interval", "200ms", "--node-name", "n1")
	testutil.Eventually(t, "n1 in the collector", func() bool { return collectorNodes(t, base)["n1"].State == "working" })
	if code := hijack(t, base, d, ""); code != 204 || !poisoned(t, base) {
		t.Fatalf("the outsider's push: %d (this collector has no credentials and takes it)", code)
	}
	var up api.UpstreamStatus
	testutil.Eventually(t, "n1's push state shows the drop", func() bool {
		s, err := d.Client.Snapshot(e2e.Ctx(t))
		if err != nil || len(s.Upstreams) != 1 {
			return false
		}
		up = s.Upstreams[0]
		return up.Failures > 0 && strings.Contains(up.LastError, "dropped")
	})
	if out, _ := gpulet(t, d, "status"); !strings.Contains(out, "dropped") {
		t.Fatalf("gpulet status does not show the dropped pushes:\n%s", out)
	}
	resp, err := d.HTTP().Get("http://gpulet/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var m bytes.Buffer
	m.ReadFrom(resp.Body)
	resp.Body.Close()
	failing := false
	for _, line := range strings.Split(m.String(), "\n") {
		if strings.HasPrefix(line, "gpulet_upstream_failures{") && !strings.HasSuffix(line, " 0") {
			failing = true
		}
	}
	if !failing {
		t.Fatalf("metrics do not count the failures:\n%s", m.String())
	}
}

// TestCollectorNodeTokens: with per-node tokens the outsider, and another
// node with its own token, are refused; the node's rows stay its own.
func TestCollectorNodeTokens(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "node-tokens")
	n1Token, n2Token := filepath.Join(dir, "n1"), filepath.Join(dir, "n2")
	for path, content := range map[string]string{tokens: "n1 secret-one\nn2 secret-two\n", n1Token: "secret-one\n", n2Token: "secret-two\n"} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	base := startCollector(t, "5s", "--node-tokens-file", tokens)
	up := base + "/v1/snapshots"
	n1 := e2e.Start(t, "--upstream", up, "--report-interval", "200ms", "--node-name", "n1", "--upstream-token-file", n1Token)
	e2e.Start(t, "--upstream", up, "--report-interval", "200ms", "--node-name", "n2", "--upstream-token-file", n2Token)
	testutil.Eventually(t, "both nodes in the collector", func() bool {
		m := collectorNodes(t, base)
		return m["n1"].State == "working" && m["n2"].State == "working"
	})
	for _, auth := range []string{"", "Bearer secret-two", "Bearer wrong", "bearer secret-two"} {
		if code := hijack(t, base, n1, auth); code != 403 {
			t.Errorf("a push as n1 with %q: %d, want 403", auth, code)
		}
	}
	if poisoned(t, base) {
		t.Fatal("a refused push changed n1's rows")
	}
	if s, _ := n1.Client.Snapshot(e2e.Ctx(t)); len(s.Upstreams) != 1 || s.Upstreams[0].Failures != 0 {
		t.Fatalf("n1's pushes fail: %+v", s.Upstreams)
	}
}

// TestCollectorClientCertificates: over TLS with --client-ca, a node pushes
// with a client certificate of its name (gpuletd --upstream-cert) and no
// token; a node whose certificate names another node is refused and sees
// it in its push state; an outsider without a certificate is refused.
func TestCollectorClientCertificates(t *testing.T) {
	ca := testutil.NewCA(t)
	serverCert, serverKey := ca.Issue(t, "127.0.0.1", false)
	pem, err := os.ReadFile(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	base := startCollectorWith(t, client, "https", "--tls-cert", serverCert, "--tls-key", serverKey, "--client-ca", ca.File)
	up := base + "/v1/snapshots"
	n1Cert, n1Key := ca.Issue(t, "n1", true)
	n1 := e2e.Start(t, "--upstream", up, "--upstream-ca", ca.File, "--upstream-cert", n1Cert, "--upstream-key", n1Key, "--report-interval", "200ms", "--node-name", "n1")
	// A node started with n1's certificate but another name.
	liar := e2e.Start(t, "--upstream", up, "--upstream-ca", ca.File, "--upstream-cert", n1Cert, "--upstream-key", n1Key, "--report-interval", "200ms", "--node-name", "n2")
	nodes := func() map[string]bool {
		resp, err := client.Get(base + "/v1/nodes")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var l struct{ Nodes []struct{ Node string } }
		json.NewDecoder(resp.Body).Decode(&l)
		m := map[string]bool{}
		for _, n := range l.Nodes {
			m[n.Node] = true
		}
		return m
	}
	testutil.Eventually(t, "n1 in the collector", func() bool { return nodes()["n1"] })
	testutil.Eventually(t, "n2's pushes refused, as it sees", func() bool {
		s, err := liar.Client.Snapshot(e2e.Ctx(t))
		return err == nil && len(s.Upstreams) == 1 && s.Upstreams[0].Failures > 0 && strings.Contains(s.Upstreams[0].LastError, "HTTP 403")
	})
	s, err := n1.Client.Snapshot(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(s)
	resp, err := client.Post(up, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 || nodes()["n2"] {
		t.Fatalf("a push without a certificate: %d; nodes %v", resp.StatusCode, nodes())
	}
}
