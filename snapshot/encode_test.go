package snapshot

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

// fill sets every field reachable from v (structs, pointers, slices of one
// element, maps of one key) to a value that is not zero and that seed
// varies, so that a field added to a snapshot type is encoded, and compared,
// without this test being told of it.
func fill(v reflect.Value, seed int) {
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), seed)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2026, 11, 25, 12, 0, seed, seed*1000, time.UTC)))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), seed+i+1)
			}
		}
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		fill(v.Index(0), seed)
		fill(v.Index(1), seed+7)
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, seed)
		fill(e, seed)
		v.SetMapIndex(k, e)
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", seed))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(seed))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(seed))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(seed) / 4)
	default:
		panic("fill: no rule for " + v.Type().String())
	}
}

func checkSameAsJSON(t *testing.T, s *api.Snapshot) {
	t.Helper()
	want, wantErr := json.Marshal(s)
	got, err := appendSnapshotJSON(nil, s, nil)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("error %v, encoding/json's %v", err, wantErr)
	}
	if wantErr == nil && !bytes.Equal(got, want) {
		t.Fatalf("encoded\n%s\nencoding/json:\n%s", got, want)
	}
}

// Every field of a snapshot, down to its GPUs' instances and capabilities,
// is encoded as encoding/json encodes it: all set, all zero, and empty
// lists, which omitempty and null tell apart.
func TestSnapshotJSONIsWhatJSONMakes(t *testing.T) {
	var full api.Snapshot
	fill(reflect.ValueOf(&full).Elem(), 1)
	empty := api.Snapshot{GPUs: []api.GPU{{Instances: []api.Instance{{Units: []int{}}}, OfflineByUID: map[string]int{}}}, Upstreams: []api.UpstreamStatus{}}
	escaped := full
	escaped.Node, escaped.GPUs = "<node> & \"quoted\"\n\u2028é\xff", []api.GPU{full.GPUs[0]}
	escaped.GPUs[0].Name = "NVIDIA <A100> & co"
	for name, s := range map[string]*api.Snapshot{
		"every field set": &full,
		"zero":            {},
		"empty lists":     &empty,
		"text to escape":  &escaped,
		"year 10000":      {Time: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		t.Run(name, func(t *testing.T) { checkSameAsJSON(t, s) })
	}
}

func FuzzSnapshotJSONIsWhatJSONMakes(f *testing.F) {
	f.Add("host1", "GPU-1", "working", "", int64(1764072000), 3, 16, -1, uint32(1000), true, "8.0")
	f.Add("<n>", "\x00\"", "é", "err\n", int64(-62135596801), 0, 0, 0, uint32(0), false, "")
	f.Fuzz(func(t *testing.T, node, uuid, state, errText string, unix int64, instances, units, util int, uid uint32, withUID bool, cc string) {
		instances, units = min(max(instances, 0), 8), min(max(units, -1), 64)
		s := &api.Snapshot{Node: node, State: state, Reason: errText, Time: time.Unix(unix, unix%1000).UTC(), UnitsFree: util}
		g := api.GPU{UUID: uuid, Name: node + uuid, State: state, Error: errText, UtilizationPct: util, Xid: uint64(uid),
			Capability: api.Capability{ComputeCapability: cc, Cores: util}}
		if withUID {
			g.OfflineByUID = map[string]int{fmt.Sprint(uid): units}
		}
		for k := range instances {
			in := api.Instance{Instance: k, State: state, Error: errText}
			if units >= 0 {
				in.Units = make([]int, units)
				for u := range in.Units {
					in.Units[u] = k*units + u
				}
			}
			if withUID {
				in.UID = &uid
				in.SlurmJobs = []uint64{uint64(uid), uint64(uid) + 1}
			}
			g.Instances = append(g.Instances, in)
		}
		s.GPUs = []api.GPU{g, g}
		checkSameAsJSON(t, s)
	})
}

// BenchmarkSnapshotJSON encodes the snapshot of a 16-GPU node whose GPUs have
// 704 units each, by appendSnapshotJSON and by encoding/json.
func BenchmarkSnapshotJSON(b *testing.B) {
	s := &api.Snapshot{Schema: api.SnapshotSchema, Node: "node", BootID: "boot", Time: time.Now().UTC(), State: "working"}
	for i := range 16 {
		units := make([]int, 704)
		for u := range units {
			units[u] = u
		}
		s.GPUs = append(s.GPUs, api.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Name: "NVIDIA A100-SXM4-80GB", State: "working",
			Instances: []api.Instance{{State: "on", Units: units}}})
	}
	b.Run("appendSnapshotJSON", func(b *testing.B) {
		for b.Loop() {
			if _, err := appendSnapshotJSON(make([]byte, 0, 128<<10), s, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			if _, err := json.Marshal(s); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// A GPU part is encoded once, by the first snapshot that needs it, and
// copied by every other snapshot it is shared with: the encoding is the one
// without parts, and a later snapshot given the part does not encode its GPU
// again.
func TestGPUPartsAreShared(t *testing.T) {
	var full api.Snapshot
	fill(reflect.ValueOf(&full).Elem(), 1)
	parts := make([]*GPUPart, len(full.GPUs))
	for i := range parts {
		parts[i] = new(GPUPart)
	}
	if got, want := NewWithGPUParts(&full, parts, nil, nil).JSON(), New(&full, nil, nil).JSON(); !bytes.Equal(got, want) {
		t.Fatalf("with parts:\n%s\nwithout:\n%s", got, want)
	}
	next := full
	next.Seq++
	next.GPUs = slices.Clone(full.GPUs)
	next.GPUs[0].UnitsUsed = 12345
	got := NewWithGPUParts(&next, parts, nil, nil).JSON()
	if bytes.Contains(got, []byte(`"units_used":12345`)) || !bytes.Contains(got, fmt.Appendf(nil, `"seq":%d`, next.Seq)) {
		t.Fatalf("the shared part was encoded again, or the snapshot's own fields were not:\n%s", got)
	}
}

// WithJSON lends the bytes JSON returns, before JSON was made (encoded into a
// reused buffer) and after (JSON's own), and a buffer lent to one reader is
// not reused by another while it reads: readers of different snapshots at
// once each see their own, whole.
func TestWithJSONLendsWhatJSONReturns(t *testing.T) {
	var full api.Snapshot
	fill(reflect.ValueOf(&full).Elem(), 1)
	snaps := make([]*api.Snapshot, 8)
	want := make([][]byte, len(snaps))
	for i := range snaps {
		s := full
		s.Seq = uint64(i + 1)
		snaps[i], want[i] = &s, New(&s, nil, nil).JSON()
	}
	var wg sync.WaitGroup
	for i := range snaps {
		wg.Go(func() {
			for range 200 {
				New(snaps[i], nil, nil).WithJSON(func(got []byte) {
					if !bytes.Equal(got, want[i]) {
						t.Errorf("snapshot %d lent:\n%s\nwant:\n%s", i, got, want[i])
					}
				})
			}
		})
	}
	wg.Wait()
	p := New(snaps[0], nil, nil)
	made := p.JSON()
	p.WithJSON(func(got []byte) {
		if &got[0] != &made[0] {
			t.Error("once JSON is made, WithJSON lends another copy of it")
		}
	})
}
