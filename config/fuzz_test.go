package config

import (
	"bytes"
	"errors"
	"hash/fnv"
	"slices"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/placement"
)

// anyone is a directory that knows every name, so that what Parse accepts
// must resolve.
type anyone struct{}

func (anyone) LookupUser(name string) (uint32, error)  { return hash(name), nil }
func (anyone) LookupGroup(name string) (uint32, error) { return hash(name), nil }

func hash(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}

// FuzzParse: Parse never panics; every error is an *Error on a line of the
// file, or about the file as a whole; what it accepts resolves on a node that
// has the GPUs it names, into well-formed Rules.
func FuzzParse(f *testing.F) {
	f.Add(designExample)
	for _, tc := range parseErrorCases {
		if len(tc.in) <= 4<<10 { // big ones only slow the fuzzer down
			f.Add(tc.in)
		}
	}
	f.Add("pools:\n  p:\n    gpus: [0, GPU-ab]\n    users: [1001, 'group:ml']\nscore: {cc: 1, bandwidth: 0.5, clock: 0}\n")
	f.Fuzz(func(t *testing.T, in string) {
		file, err := Parse([]byte(in))
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("%q: %T %v is no *Error", in, err, err)
			}
			lines := bytes.Count([]byte(in), []byte("\n")) + 1
			switch {
			case e.Line == 0 && !strings.HasPrefix(e.Msg, "empty: ") && !strings.HasPrefix(e.Msg, "larger than "):
				t.Fatalf("%q: %q has no line and is not about the whole file", in, e.Msg)
			case e.Line < 0 || e.Line > lines:
				t.Fatalf("%q: line %d of a file of %d lines: %s", in, e.Line, lines, e.Msg)
			case e.Msg == "" || strings.Contains(e.Msg, "\n"):
				t.Fatalf("%q: not one line: %q", in, e.Msg)
			}
			return
		}
		var gpus []GPURef
		for _, p := range file.Pools {
			for _, g := range p.GPUs {
				gpus = append(gpus, GPURef{Index: g.Index, UUID: g.UUID})
				if g.UUID != "" {
					gpus[len(gpus)-1].Index = MaxGPUIndex + 1 + len(gpus)
				}
			}
		}
		r, err := file.Resolve(gpus, anyone{})
		if err != nil {
			t.Fatalf("%q: parsed but does not resolve: %v", in, err)
		}
		if len(r.Pools) != len(file.Pools) || len(r.Quotas) != len(file.Quotas) || len(r.Profiles) != len(file.Profiles) {
			t.Fatalf("%q: lost entries: %+v from %+v", in, r, file)
		}
		if !slices.IsSortedFunc(r.Pools, func(a, b placement.Pool) int { return strings.Compare(a.Name, b.Name) }) {
			t.Fatalf("%q: pools not sorted", in)
		}
		for _, p := range r.Pools {
			if len(p.GPUs) == 0 || !strictlySorted(p.GPUs) || !strictlySorted(p.UIDs) || !strictlySorted(p.GIDs) {
				t.Fatalf("%q: pool %+v", in, p)
			}
			if got, ok := r.Pool(p.Name); !ok || got.Name != p.Name {
				t.Fatalf("%q: Pool(%q) does not find it", in, p.Name)
			}
		}
		if w := r.ScoreWeights(); w.CC < 0 || w.Bandwidth < 0 || w.Clock < 0 || w.CC+w.Bandwidth+w.Clock <= 0 {
			t.Fatalf("%q: weights %+v", in, w)
		}
	})
}

func strictlySorted[T int | uint32](s []T) bool {
	for i := 1; i < len(s); i++ {
		if s[i-1] >= s[i] {
			return false
		}
	}
	return true
}
