package gpurun

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
)

// gpurun --dry-run --json prints gpuletd's answer as JSON, for scripts.
func TestDryRunJSON(t *testing.T) {
	want := api.Placement{GPU: api.LeaseGPU{Index: 1, UUID: "GPU-1"}, Instance: 0, Units: []int{4, 5}, Policy: "best-fit",
		Candidates: []api.Candidate{{GPU: 0, Why: "is not whole"}, {GPU: 1, Kept: true}}}
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var asked api.LeaseRequest
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || r.URL.Path != "/v1/placements" {
			http.NotFound(w, r)
			return
		}
		json.NewDecoder(r.Body).Decode(&asked)
		json.NewEncoder(w).Encode(want)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	var out, errb bytes.Buffer
	if code := Run(context.Background(), []string{"--socket", sock, "--dry-run", "--json", "--units", "2"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var got api.Placement
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || !reflect.DeepEqual(got, want) || asked.Units != 2 {
		t.Fatalf("printed %s (%v), asked %+v; want %+v", out.String(), err, asked, want)
	}
	out.Reset()
	errb.Reset()
	if code := Run(context.Background(), []string{"--json", "--", "true"}, &out, &errb); code != ExitUsage || !strings.Contains(errb.String(), "--json prints a dry run's answer: it needs --dry-run") {
		t.Fatalf("--json without --dry-run: exit %d, %q", code, errb.String())
	}
}
