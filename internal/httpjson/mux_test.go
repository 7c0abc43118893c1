package httpjson

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
)

// testRoutes is a table with literal paths, wildcards and two methods on a
// path, as the servers' tables have.
var testRoutes = []string{"GET /a", "POST /a", "GET /a/{id}", "DELETE /a/{id}", "POST /a/{id}/x", "GET /b/c"}

// testMux routes testRoutes to handlers that answer the route's index and
// its wildcard, if any.
func testMux(opts MuxOptions) *Mux {
	m := NewMux(opts)
	for i, pattern := range testRoutes {
		m.Handle(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%d %q", i, r.PathValue("id"))
		}))
	}
	return m
}

// referenceRoute is how gpulet's servers routed before they used ServeMux,
// spelled out: the decoded path, trimmed of its slashes where trim says so,
// split on "/", each segment matched literally or by a wildcard that takes
// any but the empty segment. It returns the answer Mux is to give.
func referenceRoute(method, path string, trim bool) (status int, body string, allowed []string) {
	var segs []string
	switch {
	case trim:
		segs = strings.Split(strings.Trim(path, "/"), "/")
	case strings.HasPrefix(path, "/"):
		segs = strings.Split(path[1:], "/")
	}
	for i, pattern := range testRoutes {
		m, p, _ := strings.Cut(pattern, " ")
		want := strings.Split(p[1:], "/")
		if len(want) != len(segs) {
			continue
		}
		id, ok := "", true
		for j, w := range want {
			switch {
			case w == "{id}" && segs[j] != "":
				id = segs[j]
			case w != segs[j]:
				ok = false
			}
		}
		if !ok {
			continue
		}
		if m != method {
			allowed = append(allowed, m)
			continue
		}
		return 200, fmt.Sprintf("%d %q", i, id), nil
	}
	if allowed != nil {
		return 405, "", allowed
	}
	return 404, "", nil
}

// checkAgainstReference serves target with method on m and holds the
// answer to referenceRoute's.
func checkAgainstReference(t *testing.T, m *Mux, trim bool, method, target string) {
	t.Helper()
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return // net/http refuses it before any handler
	}
	rec := httptest.NewRecorder()
	m.ServeHTTP(rec, &http.Request{Method: method, URL: u, RequestURI: target, Header: http.Header{}, Host: "h"})
	status, body, allowed := referenceRoute(method, u.Path, trim)
	what := fmt.Sprintf("%s %q (path %q, trim %v)", method, target, u.Path, trim)
	if rec.Code != status {
		t.Fatalf("%s = %d %s; want %d %s", what, rec.Code, rec.Body, status, body)
	}
	switch status {
	case 200:
		if rec.Body.String() != body {
			t.Fatalf("%s = %s; want %s", what, rec.Body, body)
		}
	case 405:
		if got := rec.Header().Get("Allow"); got != strings.Join(allowed, ", ") {
			t.Fatalf("%s: Allow %q, want %q", what, got, allowed)
		}
		wantMessage := fmt.Sprintf("%s is not allowed on %s (allowed: %s)", method, u.Path, strings.Join(allowed, ", "))
		if msg := errorMessage(t, rec); msg != asJSON(wantMessage) {
			t.Fatalf("%s: %q, want %q", what, msg, wantMessage)
		}
	case 404:
		if msg := errorMessage(t, rec); msg != asJSON("no such endpoint: "+u.Path) {
			t.Fatalf("%s: %q", what, msg)
		}
	}
}

// asJSON is s as it reads after a trip through JSON, which replaces bytes
// that are not UTF-8.
func asJSON(s string) string {
	b, _ := json.Marshal(s)
	json.Unmarshal(b, &s)
	return s
}

func errorMessage(t *testing.T, rec *httptest.ResponseRecorder) string {
	t.Helper()
	var eb api.ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("error answer %q (%s): %v", rec.Body, rec.Header().Get("Content-Type"), err)
	}
	return eb.Error.Message
}

var testMethods = []string{"GET", "POST", "DELETE", "PUT", "HEAD", "CONNECT", "get"}

// FuzzMux holds Mux to the segment-by-segment routing it replaced, for any
// request target and method, with slashes trimmed and without.
func FuzzMux(f *testing.F) {
	for _, target := range []string{"/a", "/a/", "//a", "/a//", "/a/1", "/a/1/", "/a//1", "/a/1/x", "/a/1%2Fx", "/a%2F1",
		"/a/.", "/a/..", "/a/../x", "/a/%2E%2E/x", "/./a", "/b/c", "/b/./c", "/b/c/..", "/", "//", "*", "/a/%25", "/a/%3F",
		"/a/1%20x", "/%61/1", "http://h/a/1", "http://h", "/a?x=1", "/a/1/x/", "/a/1/y", "/b", "/c"} {
		for i := range testMethods {
			f.Add(uint8(i), target)
		}
	}
	trimmed, exact := testMux(MuxOptions{TrimSlashes: true}), testMux(MuxOptions{})
	f.Fuzz(func(t *testing.T, method uint8, target string) {
		m := testMethods[int(method)%len(testMethods)]
		checkAgainstReference(t, trimmed, true, m, target)
		checkAgainstReference(t, exact, false, m, target)
	})
}

// With HEAD, a GET route answers HEAD, and Allow names it; the message
// names the methods as the table does.
func TestMuxHEAD(t *testing.T) {
	m := testMux(MuxOptions{HEAD: true, NotFound: func(path string) error { return api.Errorf(api.ErrNotFound, "not here: %s", path) }})
	for _, tc := range []struct {
		method, target string
		status         int
		allow, message string
	}{
		{"HEAD", "/a/1", 200, "", ""},
		{"PUT", "/a/1", 405, "GET, DELETE, HEAD", "PUT is not allowed on /a/1 (allowed: GET, DELETE)"},
		{"PUT", "/a/1/x", 405, "POST", "PUT is not allowed on /a/1/x (allowed: POST)"},
		{"HEAD", "/a/1/x", 405, "POST", "HEAD is not allowed on /a/1/x (allowed: POST)"},
		{"HEAD", "/nothing", 404, "", "not here: /nothing"},
		{"GET", "//a", 404, "", "not here: //a"},
	} {
		rec := httptest.NewRecorder()
		m.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.target, nil))
		if rec.Code != tc.status || rec.Header().Get("Allow") != tc.allow {
			t.Errorf("%s %s = %d (Allow %q); want %d (Allow %q)", tc.method, tc.target, rec.Code, rec.Header().Get("Allow"), tc.status, tc.allow)
			continue
		}
		if tc.message != "" {
			if msg := errorMessage(t, rec); msg != tc.message {
				t.Errorf("%s %s: %q, want %q", tc.method, tc.target, msg, tc.message)
			}
		}
	}
}

// A route is a method and a path: a pattern for every method, or for a
// host, is a mistake in the table, found when the server is built.
func TestMuxRefusesPatternsWithoutMethod(t *testing.T) {
	for _, pattern := range []string{"/a", "example.com/a", "GET example.com/a"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Handle(%q) did not panic", pattern)
				}
			}()
			NewMux(MuxOptions{}).Handle(pattern, http.NotFoundHandler())
		}()
	}
	m := NewMux(MuxOptions{})
	m.Handle("DELETE /x", http.NotFoundHandler())
	m.Handle("GET /x", http.NotFoundHandler())
	m.Handle("DELETE /y", http.NotFoundHandler())
	if !slices.Equal(m.methods, []string{"DELETE", "GET"}) {
		t.Fatalf("methods %v, want the order first named", m.methods)
	}
}
