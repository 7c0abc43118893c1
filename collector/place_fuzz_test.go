package collector

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
)

// FuzzDecodePlacementRequest: any body is answered without a panic; one
// that is taken asks for units of one GPU or whole GPUs, never both, with a
// printable type of at most 256 bytes, and the request written back as JSON
// is taken as the same request.
func FuzzDecodePlacementRequest(f *testing.F) {
	for _, seed := range []string{
		`{"units":1}`, `{"gpus":2,"type":"A100"}`, `{"units":4,"memory_mib":8000,"min_cc":"8.0"}`,
		`{"units":1}}`, `{"units":1}]`, `{"units":1} {"units":2}`, `{"units":1,"pool":"p"}`,
		`{"units":-1}`, `{"units":1,"gpus":1}`, `{"units":1,"type":"\u0007"}`, `{"units":1,"x":1}`,
		`{"units":1e400}`, `{"units":1,"min_cc":"9.x"}`, `null`, ``, `[`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := decodePlacementRequest(bytes.NewReader(body))
		if err != nil {
			return
		}
		if (r.Units > 0) == (r.GPUs > 0) || r.Units < 0 || r.GPUs < 0 {
			t.Fatalf("%q taken as units %d, gpus %d", body, r.Units, r.GPUs)
		}
		if len(r.Type) > 256 || strings.ContainsFunc(r.Type, func(c rune) bool { return c < ' ' || c == 0x7f }) {
			t.Fatalf("%q taken with type %q", body, r.Type)
		}
		pr := PlacementRequest{Units: r.Units, GPUs: r.GPUs, MemoryMiB: r.MemoryMiB, Type: r.Type}
		if r.MinCC != (api.ComputeCapability{}) {
			pr.MinCC = r.MinCC.String()
		}
		again, err := json.Marshal(pr)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := decodePlacementRequest(bytes.NewReader(again))
		if err != nil || !reflect.DeepEqual(r2, r) {
			t.Fatalf("%q taken as %+v; written back as %s, taken as %+v, %v", body, r, again, r2, err)
		}
	})
}
