package collector

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/filestamp"
)

// Auth is who may push and read. A zero Auth lets anyone do both.
type Auth struct {
	// NodeTokens, when set, holds a token per node name: a snapshot of a
	// node is taken only with that node's token (--node-tokens-file).
	NodeTokens *WatchedFile
	// PushToken, when set, is one token for every node (--token-file); it
	// does not tie a snapshot to its node. Used only without NodeTokens.
	PushToken *WatchedFile
	// ReadToken, when set, is the token reads (GET /v1/table, /v1/nodes,
	// /v1/placements/mix, /metrics) and placements must come with
	// (--read-token-file).
	ReadToken *WatchedFile
	// LearnTokens, when set, holds a token per caller name
	// (--learn-tokens-file): a placement request with one is placed, as
	// with the read token, and learnt in the request mix as that caller's
	// once placed. No other request is learnt: the mix is steered by
	// callers the admin named, each within its share.
	LearnTokens *WatchedFile
	// ClientCerts says that the server verifies client certificates
	// (--client-ca): a snapshot of a node may come with a certificate whose
	// name is the node's, instead of a token.
	ClientCerts bool
}

// pushGuarded reports whether pushes need a credential.
func (a *Auth) pushGuarded() bool { return a.NodeTokens != nil || a.PushToken != nil || a.ClientCerts }

// certNames are the names of the client certificate r came with, verified
// against --client-ca, as crypto/x509 names a server: its DNS names, and its
// common name only in a certificate of no subject alternative names. A
// certificate that has some, none of them a DNS name, has no name (an empty
// list). Nil without a certificate.
func certNames(r *http.Request) []string {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return nil
	}
	leaf := r.TLS.VerifiedChains[0][0]
	if hasSANs(leaf) {
		return append([]string{}, leaf.DNSNames...)
	}
	return []string{leaf.Subject.CommonName}
}

// oidSubjectAltName is the extension of subject alternative names (RFC 5280,
// section 4.2.1.6).
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// hasSANs reports whether c has subject alternative names, of any kind.
func hasSANs(c *x509.Certificate) bool {
	if len(c.DNSNames)+len(c.IPAddresses)+len(c.EmailAddresses)+len(c.URIs) > 0 {
		return true
	}
	return slices.ContainsFunc(c.Extensions, func(e pkix.Extension) bool { return e.Id.Equal(oidSubjectAltName) })
}

// WatchedFile is a file of tokens read again whenever it changes (by its
// filestamp), so that a token can be added or revoked
// without a restart. A file that can no longer be read or parsed keeps its
// last good content, and the error is returned (and logged by the caller).
type WatchedFile struct {
	path  string
	parse func([]byte) (map[string]string, error)

	mu      sync.Mutex // guards what follows
	stamp   filestamp.Stamp
	entries map[string]string
	// bad is the stamp of a content that could not be parsed, and err
	// why: it is not read again until the file changes, as every request
	// asks.
	bad struct {
		stamp filestamp.Stamp
		err   error
	}
}

// OpenTokenFile reads a file of one token, for every caller.
func OpenTokenFile(path string) (*WatchedFile, error) {
	return openWatched(path, parseOneToken)
}

// OpenNodeTokensFile reads a file of node tokens: a line per node, its name
// and its token separated by white space; blank lines and lines starting with
// # are skipped.
func OpenNodeTokensFile(path string) (*WatchedFile, error) {
	return openWatched(path, ParseNodeTokens)
}

// OpenCallerTokensFile reads a file of caller tokens, written as a node
// tokens file is, with a line per caller (--learn-tokens-file).
func OpenCallerTokensFile(path string) (*WatchedFile, error) {
	return openWatched(path, func(b []byte) (map[string]string, error) { return parseNamedTokens(b, "caller") })
}

func openWatched(path string, parse func([]byte) (map[string]string, error)) (*WatchedFile, error) {
	f := &WatchedFile{path: path, parse: parse}
	if _, err := f.current(); err != nil {
		return nil, err
	}
	return f, nil
}

// anyCaller is the key of the one token of a token file.
const anyCaller = ""

func parseOneToken(b []byte) (map[string]string, error) {
	v := strings.TrimSpace(string(b))
	if v == "" || strings.ContainsAny(v, "\r\n") {
		return nil, fmt.Errorf("want one line holding the token")
	}
	return map[string]string{anyCaller: v}, nil
}

// maxTokenFile bounds a token file: 100,000 nodes with long tokens.
const maxTokenFile = 64 << 20

// ParseNodeTokens parses a node tokens file (OpenNodeTokensFile). A node
// named twice, one token given to two nodes (whoever holds it could push as
// either), a line without a token and a token with spaces are refused with
// the line's number; no error shows a token.
func ParseNodeTokens(b []byte) (map[string]string, error) { return parseNamedTokens(b, "node") }

// parseNamedTokens parses a file of lines NAME TOKEN, of names of what (a
// node, a caller).
func parseNamedTokens(b []byte, what string) (map[string]string, error) {
	out := map[string]string{}
	lineOf := map[string]int{} // the line of each token
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		switch {
		case len(f) != 2:
			return nil, fmt.Errorf("line %d: want a %s name and its token, separated by white space", n, what)
		case checkText(f[0]) != nil || checkText(f[1]) != nil:
			return nil, fmt.Errorf("line %d: a control character or invalid UTF-8", n)
		case out[f[0]] != "":
			return nil, fmt.Errorf("line %d: %s %q named twice", n, what, f[0])
		case lineOf[f[1]] != 0:
			return nil, fmt.Errorf("line %d: %s %q has the token of line %d, another %s's: give each %s its own", n, what, f[0], lineOf[f[1]], what, what)
		}
		out[f[0]] = f[1]
		lineOf[f[1]] = n
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// current returns the file's entries, reading it again when it changed.
func (f *WatchedFile) current() (map[string]string, error) {
	fi, err := os.Stat(f.path)
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case err != nil:
		return f.entries, fmt.Errorf("%s: %w", f.path, err)
	case filestamp.Of(fi) == f.stamp && f.entries != nil:
		return f.entries, nil
	case f.bad.err != nil && filestamp.Of(fi) == f.bad.stamp:
		return f.entries, f.bad.err
	case !fi.Mode().IsRegular():
		return f.entries, fmt.Errorf("%s: not a regular file", f.path)
	case fi.Size() > maxTokenFile:
		return f.entries, fmt.Errorf("%s: larger than %d bytes", f.path, maxTokenFile)
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		return f.entries, fmt.Errorf("%s: %w", f.path, err)
	}
	entries, err := f.parse(b)
	if err != nil {
		f.bad.stamp, f.bad.err = filestamp.Of(fi), fmt.Errorf("%s: %w", f.path, err)
		return f.entries, f.bad.err
	}
	f.stamp, f.entries = filestamp.Of(fi), entries
	return entries, nil
}

// bearer returns the token of an Authorization header of the Bearer scheme,
// whose name is compared without case (RFC 9110, section 11.1).
func bearer(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	token = strings.TrimLeft(token, " ")
	return token, ok && strings.EqualFold(scheme, "Bearer") && token != ""
}

// tokenMatches compares in constant time.
func tokenMatches(got, want string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// checkRead refuses a read without the read token, when one is set.
func (s *Server) checkRead(header string) error {
	if s.Auth.ReadToken == nil {
		return nil
	}
	tokens, err := s.Auth.ReadToken.current()
	if err != nil {
		s.fileErrors.Log(slog.LevelWarn, "--read-token-file: keeping the last good token", "err", err)
	}
	if got, ok := bearer(header); !ok || !tokenMatches(got, tokens[anyCaller]) {
		return api.Errorf(api.ErrForbidden, "reads here want Authorization: Bearer and the token of the collector's --read-token-file")
	}
	return nil
}

// placementCaller is who a placement request is learnt as: the caller of
// its token in --learn-tokens-file, or no one ("") for a request placed
// with the read token, or with none where reads need none. A request with
// neither is refused.
func (s *Server) placementCaller(header string) (string, error) {
	if s.Auth.LearnTokens != nil {
		tokens, err := s.Auth.LearnTokens.current()
		if err != nil {
			s.fileErrors.Log(slog.LevelWarn, "--learn-tokens-file: keeping the last good tokens", "err", err)
		}
		if got, ok := bearer(header); ok {
			for caller, token := range tokens {
				if tokenMatches(got, token) {
					return caller, nil
				}
			}
		}
	}
	return "", s.checkRead(header)
}

// checkPush refuses a snapshot of node without the credential that node
// must push with: a client certificate of its name, its own token, or else
// the shared one. names are the client certificate's (certNames).
func (s *Server) checkPush(header string, names []string, node string) error {
	if names != nil {
		switch {
		case slices.Contains(names, node):
			return nil
		case len(names) == 0:
			return api.Errorf(api.ErrForbidden, "snapshot of node %q: the client certificate has no DNS name (its common name counts only in a certificate of no subject alternative names)", node)
		}
		return api.Errorf(api.ErrForbidden, "snapshot of node %q: the client certificate is for %q, another node", node, strings.Join(names, ", "))
	}
	got, _ := bearer(header)
	if s.Auth.NodeTokens != nil {
		tokens, err := s.Auth.NodeTokens.current()
		if err != nil {
			s.fileErrors.Log(slog.LevelWarn, "--node-tokens-file: keeping the last good tokens", "err", err)
		}
		if !tokenMatches(got, tokens[node]) {
			return api.Errorf(api.ErrForbidden, "snapshot of node %q: the collector wants Authorization: Bearer and that node's token of its --node-tokens-file (gpuletd --upstream-token-file)", node)
		}
		return nil
	}
	if s.Auth.PushToken != nil {
		tokens, err := s.Auth.PushToken.current()
		if err != nil {
			s.fileErrors.Log(slog.LevelWarn, "--token-file: keeping the last good token", "err", err)
		}
		if !tokenMatches(got, tokens[anyCaller]) {
			return api.Errorf(api.ErrForbidden, "snapshot: the collector wants Authorization: Bearer and the token of its --token-file (gpuletd --upstream-token-file)")
		}
		return nil
	}
	if s.Auth.ClientCerts {
		return api.Errorf(api.ErrForbidden, "snapshot of node %q: the collector wants a client certificate of that name, issued by its --client-ca (gpuletd --upstream-cert)", node)
	}
	return nil
}
