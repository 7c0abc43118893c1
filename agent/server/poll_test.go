package server

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
)

func seqOf(t *testing.T, body string) uint64 {
	t.Helper()
	var s api.Snapshot
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatalf("snapshot %q: %v", body, err)
	}
	return s.Seq
}

// The snapshot carries its ETag; asking with it answers 304 until the
// snapshot changes.
func TestSnapshotETag(t *testing.T) {
	core := newFakeCore(t)
	core.pub.Snapshot.BootID = "boot-a"
	core.publish(1)
	c := serve(t, core)
	status, h, _ := do(t, c, "GET", "/v1/snapshot", "")
	tag := h.Get("ETag")
	if status != 200 || tag != `"boot-a-1"` {
		t.Fatalf("status %d, ETag %q", status, tag)
	}
	for _, header := range []string{tag, `"x", ` + tag, "W/" + tag, "*"} {
		req, _ := http.NewRequest("GET", "http://gpulet/v1/snapshot", nil)
		req.Header.Set("If-None-Match", header)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotModified || resp.Header.Get("ETag") != tag {
			t.Errorf("If-None-Match %s: %d, ETag %q; want 304", header, resp.StatusCode, resp.Header.Get("ETag"))
		}
	}
	core.publish(2)
	req, _ := http.NewRequest("GET", "http://gpulet/v1/snapshot", nil)
	req.Header.Set("If-None-Match", tag)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("ETag") != `"boot-a-2"` {
		t.Fatalf("after a change: %d, ETag %q; want 200 with the new tag", resp.StatusCode, resp.Header.Get("ETag"))
	}
}

// A long poll answers as soon as a newer snapshot exists, at once when there
// is one already, and with the current one when the wait runs out.
func TestSnapshotLongPoll(t *testing.T) {
	core := newFakeCore(t)
	core.pub.Snapshot.BootID = "boot-a"
	core.publish(5)
	c := serve(t, core)
	if status, _, body := do(t, c, "GET", "/v1/snapshot?after=4&wait=60s", ""); status != 200 || seqOf(t, body) != 5 {
		t.Fatalf("after an older seq: %d, seq %d; want the current one at once", status, seqOf(t, body))
	}
	if status, _, body := do(t, c, "GET", "/v1/snapshot?after=other-boot-9&wait=60s", ""); status != 200 || seqOf(t, body) != 5 {
		t.Fatalf("after a seq of another run: %d %s; want the current one at once", status, body)
	}
	type answer struct {
		status int
		etag   string
		body   string
		err    error
	}
	polled := make(chan answer, 1)
	go func() {
		resp, err := c.Get("http://gpulet/v1/snapshot?after=boot-a-5&wait=60s")
		if err != nil {
			polled <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		polled <- answer{resp.StatusCode, resp.Header.Get("ETag"), string(b), err}
	}()
	// The change comes once the poll waits for one, so that the change is
	// what answers it.
	testutil.Eventually(t, "the long poll to wait", func() bool { return len(polled) > 0 || testutil.Parked("server.(*Server).newer") })
	core.publish(6)
	select {
	case a := <-polled:
		if a.err != nil || a.status != 200 || seqOf(t, a.body) != 6 || a.etag != `"boot-a-6"` {
			t.Fatalf("waiting for a newer one: %d, %v, ETag %q, %s", a.status, a.err, a.etag, a.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the long poll did not answer the change within 10s")
	}
	if status, _, body := do(t, c, "GET", "/v1/snapshot?after=6&wait=50ms", ""); status != 200 || seqOf(t, body) != 6 {
		t.Fatalf("no change within the wait: %d, seq %d; want the current one", status, seqOf(t, body))
	}
	for _, q := range []struct{ query, field string }{
		{"wait=1s", "after"}, {"after=x", "after"}, {"after=-1", "after"}, {"after=1&wait=2m", "wait"}, {"after=1&wait=-1s", "wait"}, {"after=1&wait=soon", "wait"},
	} {
		status, _, body := do(t, c, "GET", "/v1/snapshot?"+q.query, "")
		if status != 400 || !strings.Contains(body, q.field+":") {
			t.Errorf("?%s: %d %s; want 400 naming %s", q.query, status, body, q.field)
		}
	}
}

func FuzzParsePoll(f *testing.F) {
	for _, s := range []string{"after=1", "after=1&wait=30s", "after=boot-a-5&wait=0s", "wait=1s", "after=&wait=", "after=18446744073709551616", "after=a-b-c-7&wait=60s", "after=1&wait=61s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		_, wait, err := parsePoll(q)
		if err != nil && !errors.Is(err, api.ErrBadRequest) {
			t.Fatalf("%q: error %v is not a bad_request", raw, err)
		}
		if err == nil && (wait < 0 || wait > maxPollWait) {
			t.Fatalf("%q: wait %s outside 0 to %s", raw, wait, maxPollWait)
		}
	})
}
