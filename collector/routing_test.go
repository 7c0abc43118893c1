package collector

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/internal/testutil"
)

// TestRouting pins how the collector routes: each route reaches its handler
// by its method (HEAD is not GET), another method is a 405 that says which is
// allowed, and every other path a 404, the paths matched exactly as the
// decoded path is written: no slash more or less, "%2F" a slash, "." and
// ".." never resolved.
func TestRouting(t *testing.T) {
	s := NewServer(NewStore(15*time.Second, time.Now), nil)
	notAllowed := func(method, target, allow string) testutil.Route {
		return testutil.Route{Method: method, Target: target, Status: 405, Allow: allow,
			Message: fmt.Sprintf("%s is not allowed on %s (allowed: %s)", method, target, allow)}
	}
	noEndpoint := func(method, target, path string) testutil.Route {
		return testutil.Route{Method: method, Target: target, Status: 404, Message: "no such endpoint: " + path}
	}
	for _, tc := range []testutil.Route{
		// Every route reaches its handler.
		{Method: "GET", Target: "/metrics", Status: 200},
		{Method: "GET", Target: "/v1/nodes", Status: 200},
		{Method: "GET", Target: "/v1/nodes?x=1", Status: 400, Message: "/v1/nodes takes no query parameters"},
		{Method: "POST", Target: "/v1/placements", Body: `{`, Status: 400},
		{Method: "GET", Target: "/v1/placements/mix", Status: 200},
		{Method: "POST", Target: "/v1/snapshots", Body: `{`, Status: 400},
		{Method: "GET", Target: "/v1/table", Status: 200},
		{Method: "GET", Target: "/v1%2Fnodes", Status: 200},
		{Method: "GET", Target: "/v1/%6Eodes", Status: 200},
		{Method: "GET", Target: "http://collector/v1/table", Status: 200},

		// Another Method: 405.
		notAllowed("POST", "/metrics", "GET"),
		notAllowed("POST", "/v1/nodes", "GET"),
		notAllowed("GET", "/v1/placements", "POST"),
		notAllowed("POST", "/v1/placements/mix", "GET"),
		notAllowed("GET", "/v1/snapshots", "POST"),
		notAllowed("PUT", "/v1/snapshots", "POST"),
		notAllowed("DELETE", "/v1/table", "GET"),
		notAllowed("OPTIONS", "/v1/table", "GET"),
		notAllowed("get", "/v1/nodes", "GET"),
		notAllowed("HEAD", "/v1/nodes", "GET"),
		notAllowed("HEAD", "/metrics", "GET"),

		// Every other path: 404, whatever the method.
		noEndpoint("GET", "/v1/nothing", "/v1/nothing"),
		noEndpoint("PUT", "/nothing", "/nothing"),
		noEndpoint("HEAD", "/nothing", "/nothing"),
		noEndpoint("GET", "/", "/"),
		noEndpoint("GET", "*", "*"),
		noEndpoint("GET", "/v1/nodes/", "/v1/nodes/"),
		noEndpoint("POST", "/v1/snapshots/", "/v1/snapshots/"),
		noEndpoint("POST", "/v1/placements/", "/v1/placements/"),
		noEndpoint("GET", "/v1/placements/mix/", "/v1/placements/mix/"),
		noEndpoint("GET", "//v1/nodes", "//v1/nodes"),
		noEndpoint("GET", "/v1//nodes", "/v1//nodes"),
		noEndpoint("GET", "/v1/./nodes", "/v1/./nodes"),
		noEndpoint("GET", "/v1/table/..", "/v1/table/.."),
		noEndpoint("GET", "/v1/x/../nodes", "/v1/x/../nodes"),
		noEndpoint("GET", "/v1/nodes%2F", "/v1/nodes/"),
		noEndpoint("GET", "/V1/nodes", "/V1/nodes"),
	} {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(tc.Method, tc.Target, strings.NewReader(tc.Body)))
		testutil.CheckRoute(t, tc, rec.Code, rec.Header(), rec.Body.String())
	}
}
