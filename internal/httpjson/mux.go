package httpjson

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/gpulet/gpulet/api"
)

// Mux routes requests by http.ServeMux's method patterns ("GET
// /v1/leases/{id}") and answers every request no pattern takes with the
// API's JSON errors: not_found (404) where no pattern has the path,
// method_not_allowed (405, with Allow) where patterns have it for other
// methods. ServeMux alone would answer those in plain text.
//
// Paths are matched as gpulet's servers always matched them, not as
// ServeMux alone would: the decoded path, split on "/" (so an encoded slash
// separates segments too), each segment as written ("." and ".." are
// segments like any other, never resolved), and a path never redirected. A
// path with an empty segment (the root, "//", a trailing slash where
// MuxOptions.TrimSlashes is off) has no route.
type Mux struct {
	mux  http.ServeMux
	opts MuxOptions
	// methods are those the patterns name, in the order first named: the
	// order of Allow.
	methods []string
	// patterns are the routes' patterns, in the order handled.
	patterns []string
}

// MuxOptions are what differs between the servers' paths and refusals.
type MuxOptions struct {
	// TrimSlashes matches a path without its leading and trailing slashes
	// ("//v1/leases/" as "/v1/leases"); otherwise as written.
	TrimSlashes bool
	// HEAD answers HEAD where a pattern has GET (ServeMux's way; net/http
	// leaves the body off). Otherwise HEAD is a method like any other, and
	// no pattern names it.
	HEAD bool
	// NotFound is the error for a path no pattern has; nil: "no such
	// endpoint: PATH".
	NotFound func(path string) error
}

// everyPath is the pattern that takes what no route takes, to refuse it.
const everyPath = "/"

// NewMux returns a Mux without routes.
func NewMux(opts MuxOptions) *Mux {
	m := &Mux{opts: opts}
	m.mux.Handle(everyPath, http.HandlerFunc(m.refuse))
	return m
}

// Handle routes pattern, "METHOD /path" with {name} wildcards as ServeMux
// has them, to h, before the Mux serves. It panics where ServeMux does, and
// on a pattern that is not a method and a path.
func (m *Mux) Handle(pattern string, h http.Handler) {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok || !strings.HasPrefix(strings.TrimLeft(path, " \t"), "/") {
		panic("httpjson: route " + pattern + ": want METHOD /path")
	}
	m.mux.Handle(pattern, h)
	m.patterns = append(m.patterns, pattern)
	if !slices.Contains(m.methods, method) {
		m.methods = append(m.methods, method)
	}
}

// Patterns lists the routes' patterns in the order they were handled, so
// that a test can hold a server's route table to its documentation.
func (m *Mux) Patterns() []string { return slices.Clone(m.patterns) }

func (m *Mux) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	routed, ok := m.routable(r)
	switch {
	case !ok:
		m.refuseWith(w, r, r.URL.Path, nil)
	case r.Method == http.MethodHead && !m.opts.HEAD:
		m.refuse(w, routed)
	default:
		m.mux.ServeHTTP(w, routed)
	}
}

// originalPathKey carries the path as the request had it, where routable
// changed it, for the messages of refusals.
type originalPathKey struct{}

// routable is r as the patterns are to see it: its decoded path, without
// the leading and trailing slashes where TrimSlashes says so, with an
// encoded slash a separator and "." and ".." escaped so that ServeMux
// neither resolves them nor redirects. It is false for a path with no
// route: one with an empty segment, or none ("*", an absolute target
// without a path).
//
// The common request, a clean path sent unescaped, is passed on as it is.
func (m *Mux) routable(r *http.Request) (*http.Request, bool) {
	path := r.URL.Path
	if !strings.HasPrefix(path, "/") {
		return nil, false
	}
	if m.opts.TrimSlashes {
		trimmed := strings.Trim(path, "/")
		if trimmed == "" {
			return nil, false
		}
		lead := len(path) - len(strings.TrimLeft(path, "/"))
		path = path[lead-1 : lead+len(trimmed)]
	}
	dots := false
	for start, i := 1, 1; i <= len(path); i++ {
		if i < len(path) && path[i] != '/' {
			continue
		}
		switch path[start:i] {
		case "":
			return nil, false
		case ".", "..":
			dots = true
		}
		start = i + 1
	}
	if path == r.URL.Path && r.URL.RawPath == "" && !dots {
		return r, true
	}
	u := *r.URL
	u.Path, u.RawPath = path, ""
	if dots {
		u.RawPath = escapeSegments(path)
	}
	routed := r.WithContext(context.WithValue(r.Context(), originalPathKey{}, r.URL.Path))
	routed.URL = &u
	return routed, true
}

// escapeSegments is path escaped segment by segment, "." and ".." too
// (ServeMux would resolve them), each still matching as itself.
func escapeSegments(path string) string {
	segs := strings.Split(path[1:], "/")
	for i, seg := range segs {
		switch seg {
		case ".":
			segs[i] = "%2E"
		case "..":
			segs[i] = "%2E%2E"
		default:
			segs[i] = url.PathEscape(seg)
		}
	}
	return "/" + strings.Join(segs, "/")
}

// refuse answers a request no route takes.
func (m *Mux) refuse(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if p, ok := r.Context().Value(originalPathKey{}).(string); ok {
		path = p
	}
	m.refuseWith(w, r, path, m.allowed(r))
}

// allowed lists the methods routed on r's path, asking the patterns
// method by method: refusals are rare, and so this costs the routed
// requests nothing.
func (m *Mux) allowed(r *http.Request) []string {
	var allowed []string
	probe := *r
	for _, method := range m.methods {
		probe.Method = method
		if _, pattern := m.mux.Handler(&probe); pattern != everyPath {
			allowed = append(allowed, method)
		}
	}
	return allowed
}

// refuseWith answers 404 where no method is allowed on path, else 405.
func (m *Mux) refuseWith(w http.ResponseWriter, r *http.Request, path string, allowed []string) {
	if len(allowed) == 0 {
		err := api.Errorf(api.ErrNotFound, "no such endpoint: %s", path)
		if m.opts.NotFound != nil {
			err = m.opts.NotFound(path)
		}
		Error(w, err, nil)
		return
	}
	header := allowed
	if m.opts.HEAD && slices.Contains(allowed, http.MethodGet) {
		header = append(slices.Clip(allowed), http.MethodHead)
	}
	w.Header().Set("Allow", strings.Join(header, ", "))
	Error(w, api.Errorf(api.ErrMethodNotAllowed, "%s is not allowed on %s (allowed: %s)", r.Method, path, strings.Join(allowed, ", ")), nil)
}
