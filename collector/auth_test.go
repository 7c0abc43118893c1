package collector

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/placement"
)

// tokenFile writes content to a fresh token file and opens it.
func tokenFile(t *testing.T, content string) *WatchedFile {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := OpenTokenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// callerTokensFile writes content to a fresh caller tokens file
// (--learn-tokens-file) and opens it.
func callerTokensFile(t testing.TB, content string) *WatchedFile {
	t.Helper()
	path := filepath.Join(t.TempDir(), "learn-tokens")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := OpenCallerTokensFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// nodeTokensFile writes content to a fresh node tokens file and opens it.
func nodeTokensFile(t *testing.T, content string) (*WatchedFile, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "node-tokens")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := OpenNodeTokensFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return f, path
}

// rewrite gives path new content with a modification time surely apart
// from the last.
func rewrite(t *testing.T, path, content string, age time.Duration) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	when := time.Now().Add(age)
	os.Chtimes(path, when, when)
}

// send POSTs node's snapshot with the Authorization header auth and returns
// the status and the outcome header.
func send(t *testing.T, s *Server, node, boot string, seq uint64, auth string) (int, string) {
	t.Helper()
	b, _ := json.Marshal(testSnapshot(node, boot, seq, 4, 1))
	req := httptest.NewRequest("POST", "/v1/snapshots", bytes.NewReader(b))
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec.Code, rec.Header().Get("Gpulet-Snapshot-Outcome")
}

// With per-node tokens, a node's rows come only from that node: another
// node's token, the shared one or none is refused, whatever seq it claims.
func TestNodeTokens(t *testing.T) {
	st := NewStore(time.Minute, nil)
	s := NewServer(st, nil)
	var path string
	s.Auth.NodeTokens, path = nodeTokensFile(t, "# node token\nnode-a tok-a\n\nnode-b   tok-b\n")
	if code, _ := send(t, s, "node-a", "boot", 1, "Bearer tok-a"); code != 204 {
		t.Fatalf("node-a with its token: %d", code)
	}
	for _, tc := range []struct{ node, auth string }{
		{"node-a", "Bearer tok-b"}, {"node-a", ""}, {"node-a", "Bearer "}, {"node-a", "Basic tok-a"},
		{"node-c", "Bearer tok-a"}, {"node-a", "Bearer tok-a "}, {"node-a", "Bearertok-a"},
	} {
		if code, _ := send(t, s, tc.node, "boot", 1<<63, tc.auth); code != 403 {
			t.Errorf("%s with %q: %d, want 403", tc.node, tc.auth, code)
		}
	}
	if n := st.Nodes().Nodes; len(n) != 1 || n[0].Seq != 1 {
		t.Fatalf("a refused push changed the table: %+v", n)
	}
	// The scheme is compared without case (RFC 9110).
	for i, scheme := range []string{"bearer", "BEARER", "BeArEr"} {
		if code, _ := send(t, s, "node-b", "boot", uint64(i+1), scheme+" tok-b"); code != 204 {
			t.Errorf("scheme %q: %d, want 204", scheme, code)
		}
	}
	// Revoked and added on the file's change, without a restart.
	rewrite(t, path, "node-a tok-a2\nnode-c tok-c\n", time.Second)
	if code, _ := send(t, s, "node-a", "boot", 2, "Bearer tok-a"); code != 403 {
		t.Fatalf("node-a's old token after the change: %d, want 403", code)
	}
	if code, _ := send(t, s, "node-a", "boot", 2, "Bearer tok-a2"); code != 204 {
		t.Fatalf("node-a's new token: %d", code)
	}
	if code, _ := send(t, s, "node-c", "boot", 1, "Bearer tok-c"); code != 204 {
		t.Fatalf("a node added to the file: %d", code)
	}
	if code, _ := send(t, s, "node-b", "boot", 9, "Bearer tok-b"); code != 403 {
		t.Fatalf("a node taken out of the file: %d, want 403", code)
	}
	// A broken file keeps the last good tokens.
	rewrite(t, path, "node-a\n", 2*time.Second)
	if code, _ := send(t, s, "node-a", "boot", 3, "Bearer tok-a2"); code != 204 {
		t.Fatalf("after a broken rewrite: %d, want the last good tokens to hold", code)
	}
}

// The shared token file is read again when it changes, and its scheme is
// compared without case.
func TestSharedTokenReread(t *testing.T) {
	s := NewServer(NewStore(time.Minute, nil), nil)
	s.Auth.PushToken = tokenFile(t, "one\n")
	if code, _ := send(t, s, "n", "b", 1, "bearer one"); code != 204 {
		t.Fatalf("lower-case scheme: %d", code)
	}
	rewrite(t, s.Auth.PushToken.path, "two\n", time.Second)
	if code, _ := send(t, s, "n", "b", 2, "Bearer one"); code != 403 {
		t.Fatalf("the old token after the change: %d, want 403", code)
	}
	if code, _ := send(t, s, "n", "b", 2, "Bearer two"); code != 204 {
		t.Fatalf("the new token: %d", code)
	}
}

// With a read token, reads need it; pushes do not use it.
func TestReadToken(t *testing.T) {
	s := NewServer(NewStore(time.Minute, nil), nil)
	s.Auth.ReadToken = tokenFile(t, "reader\n")
	for _, path := range []string{"/v1/table", "/v1/nodes", "/metrics", "/v1/placements/mix", "/v1/placements"} {
		for auth, want := range map[string]int{"": 403, "Bearer nope": 403, "Bearer reader": 200, "bearer reader": 200} {
			method, body := "GET", ""
			if path == "/v1/placements" {
				// An empty table: the request is read, and refused as no
				// node can take it, once the token is right.
				method, body = "POST", `{"units":1}`
				if want == 200 {
					want = 409
				}
			}
			req := httptest.NewRequest(method, path, strings.NewReader(body))
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)
			if rec.Code != want {
				t.Errorf("%s %s with %q: %d, want %d", method, path, auth, rec.Code, want)
			}
		}
	}
	// A caller's learn token places, as the read token does, and reads
	// nothing.
	s.Auth.LearnTokens = callerTokensFile(t, "sched learner\n")
	if code, b := doAs(t, s, "Bearer learner", "POST", "/v1/placements", `{"units":1}`); code != 409 {
		t.Errorf("a placement with a learn token: %d %s, want 409 (no node)", code, b)
	}
	for _, path := range []string{"/v1/table", "/v1/placements/mix"} {
		if code, _ := doAs(t, s, "Bearer learner", "GET", path, ""); code != 403 {
			t.Errorf("GET %s with a learn token: %d, want 403", path, code)
		}
	}
	if code, _ := send(t, s, "n", "b", 1, ""); code != 204 {
		t.Fatalf("a push without credentials where only reads need one: %d", code)
	}
}

// A snapshot older than the node's rows is answered 204 as before, but
// the header tells the sender it was dropped; a resend of the same seq is
// "repeated".
func TestOutcomeHeader(t *testing.T) {
	s := NewServer(NewStore(time.Minute, nil), nil)
	for _, step := range []struct {
		seq  uint64
		want string
	}{{5, "applied"}, {5, "repeated"}, {1<<64 - 1, "applied"}, {6, "dropped"}} {
		if code, got := send(t, s, "n", "b", step.seq, ""); code != 204 || got != step.want {
			t.Fatalf("seq %d: %d %q, want 204 %q", step.seq, code, got, step.want)
		}
	}
}

func TestParseNodeTokens(t *testing.T) {
	for _, bad := range []string{"a\n", "a b c\n", "a x\na y\n", "a\x1bb tok\n", "a tok\x00\n"} {
		if _, err := ParseNodeTokens([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	got, err := ParseNodeTokens([]byte("# c\n a  t1 \n\nb\tt2\n"))
	if err != nil || len(got) != 2 || got["a"] != "t1" || got["b"] != "t2" {
		t.Fatalf("%v %v", got, err)
	}
}

func FuzzParseNodeTokens(f *testing.F) {
	for _, s := range []string{"a t\n", "# x\n", "a b c", "a t\na u\n", "a t\nb t\n", strings.Repeat("x", 70000)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseNodeTokens(b)
		if err != nil {
			return
		}
		nodeOf := map[string]string{}
		for node, tok := range m {
			if node == "" || tok == "" || strings.ContainsAny(node+tok, " \t\r\n") {
				t.Fatalf("entry %q %q", node, tok)
			}
			if other, ok := nodeOf[tok]; ok {
				t.Fatalf("nodes %q and %q share a token", other, node)
			}
			nodeOf[tok] = node
		}
	})
}

// Under frag without --learn-tokens-file the collector says, at warning
// level, that it learns from no one and places as best-fit.
func TestWarnLearn(t *testing.T) {
	for _, tc := range []struct {
		name   string
		learn  *WatchedFile
		policy placement.Policy
		want   string
	}{
		{"frag, no learn tokens", nil, placement.Frag, "no --learn-tokens-file"},
		{"frag, learn tokens", callerTokensFile(t, "s t\n"), placement.Frag, ""},
		{"best-fit, no learn tokens", nil, placement.BestFit, ""},
	} {
		var buf bytes.Buffer
		warnLearn(slog.New(slog.NewTextHandler(&buf, nil)), Auth{LearnTokens: tc.learn}, tc.policy)
		got := buf.String()
		if tc.want == "" && got != "" || tc.want != "" && (!strings.Contains(got, tc.want) || !strings.Contains(got, "level=WARN")) {
			t.Errorf("%s: logged %q, want %q", tc.name, got, tc.want)
		}
	}
}

// Without per-node tokens the collector says, at warning level, that
// anyone may push as any node.
func TestWarnAuth(t *testing.T) {
	for _, tc := range []struct {
		name string
		auth Auth
		want string
	}{
		{"none", Auth{}, "ANYONE who reaches this port may push"},
		{"shared", Auth{PushToken: tokenFile(t, "x\n")}, "one --token-file for every node"},
		{"per node", Auth{NodeTokens: tokenFile(t, "x\n"), ReadToken: tokenFile(t, "y\n")}, ""},
		{"client certificates", Auth{ClientCerts: true, ReadToken: tokenFile(t, "y\n")}, ""},
		{"client certificates and a shared token", Auth{ClientCerts: true, PushToken: tokenFile(t, "x\n")}, "one --token-file for every node"},
	} {
		var buf bytes.Buffer
		warnAuth(slog.New(slog.NewTextHandler(&buf, nil)), tc.auth)
		got := buf.String()
		if tc.want == "" && got != "" || tc.want != "" && (!strings.Contains(got, tc.want) || !strings.Contains(got, "level=WARN")) {
			t.Errorf("%s: logged %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestBearer(t *testing.T) {
	for header, want := range map[string]string{
		"Bearer tok": "tok", "bearer tok": "tok", "BEARER  tok": "tok",
		"Bearer": "", "Bearer ": "", "Basic tok": "", "Bearertok": "", "": "", "tok": "",
	} {
		got, ok := bearer(header)
		if ok != (want != "") || got != want && ok {
			t.Errorf("bearer(%q) = %q, %v; want %q", header, got, ok, want)
		}
	}
}

func FuzzBearer(f *testing.F) {
	for _, s := range []string{"Bearer t", "bearer  t", "Basic x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		if tok, ok := bearer(header); ok && (tok == "" || !strings.Contains(header, tok) || !strings.EqualFold(header[:6], "bearer")) {
			t.Fatalf("bearer(%q) = %q", header, tok)
		}
	})
}

// A rewrite that does not parse is read once, not at every request until the
// file changes again: a node tokens file of 100,000 nodes is megabytes, and
// snapshots come thousands a second. Once fixed, it is read again.
func TestBrokenRewriteIsReadOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node-tokens")
	if err := os.WriteFile(path, []byte("node-a tok-a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	parses := 0
	f, err := openWatched(path, func(b []byte) (map[string]string, error) { parses++; return ParseNodeTokens(b) })
	if err != nil {
		t.Fatal(err)
	}
	rewrite(t, path, "node-a\n", time.Second)
	for range 3 {
		if tokens, err := f.current(); err == nil || tokens["node-a"] != "tok-a" {
			t.Fatalf("after a broken rewrite: %v %v, want an error and the last good tokens", tokens, err)
		}
	}
	if parses != 2 {
		t.Fatalf("parsed %d times, want twice: at open and once after the broken rewrite", parses)
	}
	rewrite(t, path, "node-a tok-a2\n", 2*time.Second)
	if tokens, err := f.current(); err != nil || tokens["node-a"] != "tok-a2" {
		t.Fatalf("after the fix: %v %v", tokens, err)
	}
}

// A token rotated to one of the same length with the file's old modification
// time kept (cp -p, touch -r) is seen: the old token is refused at once.
func TestSameLengthRotationKeepingTheTimeIsSeen(t *testing.T) {
	s := NewServer(NewStore(time.Minute, nil), nil)
	s.Auth.PushToken = tokenFile(t, "token-one\n")
	path := s.Auth.PushToken.path
	then := time.Unix(1_700_000_000, 0)
	os.Chtimes(path, then, then)
	if code, _ := send(t, s, "n", "b", 1, "Bearer token-one"); code != 204 {
		t.Fatalf("the first token: %d", code)
	}
	// The change time ticks with the kernel's clock (a jiffy, 10 ms at most).
	time.Sleep(25 * time.Millisecond)
	rewrite(t, path, "token-two\n", 0)
	os.Chtimes(path, then, then)
	if code, _ := send(t, s, "n", "b", 2, "Bearer token-one"); code != 403 {
		t.Fatalf("the old token after a same-length rotation that kept the time: %d, want 403", code)
	}
	if code, _ := send(t, s, "n", "b", 2, "Bearer token-two"); code != 204 {
		t.Fatalf("the new token: %d", code)
	}
}

// A node tokens file that gives one token to two nodes is refused, naming
// both lines and neither token: whoever holds it could push as either.
func TestParseNodeTokensRefusesASharedToken(t *testing.T) {
	_, err := ParseNodeTokens([]byte("a t1\nb t2\nc t1\n"))
	if err == nil || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), "line 1") || strings.Contains(err.Error(), "t1") {
		t.Fatalf("one token for nodes a and c: %v, want an error naming lines 1 and 3 and not the token", err)
	}
}

// A client certificate is named by its subject alternative names, its
// common name only when it has none, as crypto/x509 names a server.
func TestCertNamesFollowX509(t *testing.T) {
	withCert := func(c *x509.Certificate) *http.Request {
		r := httptest.NewRequest("POST", "/v1/snapshots", nil)
		r.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{c}}}
		return r
	}
	for _, tc := range []struct {
		name string
		cert x509.Certificate
		want []string
	}{
		{"SAN and CN", x509.Certificate{DNSNames: []string{"node-c"}, Subject: pkix.Name{CommonName: "gpulet-node"}}, []string{"node-c"}},
		{"CN alone", x509.Certificate{Subject: pkix.Name{CommonName: "node-a"}}, []string{"node-a"}},
		{"an IP SAN and a CN", x509.Certificate{IPAddresses: []net.IP{net.IPv4(10, 0, 0, 1)}, Subject: pkix.Name{CommonName: "node-a"}}, []string{}},
		{"an email SAN and a CN", x509.Certificate{EmailAddresses: []string{"ops@example.com"}, Subject: pkix.Name{CommonName: "node-a"}}, []string{}},
	} {
		got := certNames(withCert(&tc.cert))
		if got == nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: names %q, want %q", tc.name, got, tc.want)
		}
	}
	if got := certNames(httptest.NewRequest("GET", "/", nil)); got != nil {
		t.Errorf("no certificate: names %q, want none", got)
	}
	// Pushing as the CN of a certificate with SANs is refused, with a
	// message that names what the certificate is for.
	s := NewServer(NewStore(time.Minute, nil), nil)
	err := s.checkPush("", certNames(withCert(&x509.Certificate{DNSNames: []string{"node-c"}, Subject: pkix.Name{CommonName: "gpulet-node"}})), "gpulet-node")
	if err == nil || !strings.Contains(err.Error(), "node-c") {
		t.Errorf("pushing as the CN of a certificate with a SAN: %v, want refused", err)
	}
	err = s.checkPush("", certNames(withCert(&x509.Certificate{IPAddresses: []net.IP{net.IPv4(10, 0, 0, 1)}, Subject: pkix.Name{CommonName: "node-a"}})), "node-a")
	if err == nil || !strings.Contains(err.Error(), "no DNS name") {
		t.Errorf("pushing with a certificate of no DNS name: %v, want refused", err)
	}
}
