package server

import (
	"io"
	"log/slog"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
)

// docs/api.md's route table is the users' reference for the socket API
// (docs/design.md §6, a contract); these tests hold it to the routes New
// registers, the request bodies to the api types' JSON keys, and the
// --listen row of docs/gpuletd.md to the read-only routes.

// docRoute matches a route as the docs write it: `METHOD /path`, a query or
// "with …" after it left out.
var docRoute = regexp.MustCompile("`(GET|HEAD|POST|PUT|PATCH|DELETE) (/[^`?\\s]*)[^`]*`")

// wildcard is a path wildcard; its name is left out of the comparison (the
// docs may call the Slurm job's {id} what the pattern calls {job}).
var wildcard = regexp.MustCompile(`\{[^}]*\}`)

func normRoute(method, path string) string {
	return method + " " + wildcard.ReplaceAllString(path, "{}")
}

// routeRows reads the route table of docs/api.md: each route named in a
// row's first cell, with the text of every row that names it.
func routeRows(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	in := false
	for line := range strings.Lines(string(b)) {
		switch {
		case strings.HasPrefix(line, "| method and path |"):
			in = true
		case in && !strings.HasPrefix(line, "|"):
			in = false
		case in && !strings.HasPrefix(line, "| ---"):
			first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
			for _, m := range docRoute.FindAllStringSubmatch(first, -1) {
				r := normRoute(m[1], m[2])
				rows[r] += line
			}
		}
	}
	if len(rows) == 0 {
		t.Fatal("docs/api.md: no route table (a header row \"| method and path |\")")
	}
	return rows
}

// socketRoutes are the routes New registers, the simulated backend's
// included.
func socketRoutes(t *testing.T) (*Server, []string) {
	core := newFakeCore(t)
	core.sim = true
	s := New(partsOf(core), -1, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var out []string
	for _, p := range s.routes.Patterns() {
		method, path, _ := strings.Cut(p, " ")
		out = append(out, normRoute(method, path))
	}
	return s, out
}

func TestRouteTableMatchesRoutes(t *testing.T) {
	rows := routeRows(t)
	_, routes := socketRoutes(t)
	for _, r := range routes {
		if _, ok := rows[r]; !ok {
			t.Errorf("%s is a route of the socket, but no row of docs/api.md's route table names it", r)
		}
	}
	for r := range rows {
		if !slices.Contains(routes, r) {
			t.Errorf("docs/api.md's route table names %s, which is no route of the socket", r)
		}
	}
}

// jsonKey is a key of a JSON object as the docs write one in an example.
var jsonKey = regexp.MustCompile(`"([a-z_]+)":`)

// TestRouteTableBodies holds the request bodies shown in the route table to
// the types the server decodes them into: every key of the type appears in
// the rows of its route as "key", and every key an example there shows is one
// of the type's.
func TestRouteTableBodies(t *testing.T) {
	rows := routeRows(t)
	for route, types := range map[string][]any{
		"POST /v1/leases":       {api.LeaseRequest{}},
		"POST /v1/reservations": {api.ReservationRequest{}, api.ShareMember{}},
		"POST /v1/node/undrain": {api.UndrainRequest{}},
		"POST /v1/sim/gpus/{}":  {api.SimGPUUpdate{}, api.SimProcess{}},
	} {
		text, ok := rows[route]
		if !ok {
			t.Errorf("docs/api.md: no row for %s", route)
			continue
		}
		var keys []string
		for _, v := range types {
			keys = append(keys, jsonKeys(reflect.TypeOf(v))...)
		}
		for _, k := range keys {
			if !strings.Contains(text, `"`+k+`"`) {
				t.Errorf("docs/api.md, %s: the body's key %q is not shown", route, k)
			}
		}
		for _, m := range jsonKey.FindAllStringSubmatch(text, -1) {
			if !slices.Contains(keys, m[1]) {
				t.Errorf("docs/api.md, %s: the example's key %q is no key of the body", route, m[1])
			}
		}
	}
}

// jsonKeys are the JSON keys of struct type t.
func jsonKeys(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}

// The --listen row of docs/gpuletd.md names exactly the read-only routes,
// and each of them is a route of the socket too (served the same).
func TestListenRowMatchesReadOnlyRoutes(t *testing.T) {
	s, socket := socketRoutes(t)
	var ro []string
	for _, p := range s.ReadOnlyHTTPServer(false).Handler.(*readOnly).routes.Patterns() {
		method, path, _ := strings.Cut(p, " ")
		r := normRoute(method, path)
		ro = append(ro, r)
		if !slices.Contains(socket, r) {
			t.Errorf("read-only route %s is no route of the socket", r)
		}
	}
	b, err := os.ReadFile("../../docs/gpuletd.md")
	if err != nil {
		t.Fatal(err)
	}
	var doc []string
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "| `--listen` |") {
			for _, m := range docRoute.FindAllStringSubmatch(line, -1) {
				doc = append(doc, normRoute(m[1], m[2]))
			}
		}
	}
	slices.Sort(ro)
	slices.Sort(doc)
	if !slices.Equal(ro, doc) {
		t.Errorf("docs/gpuletd.md's --listen row names %v; the read-only routes are %v", doc, ro)
	}
}
