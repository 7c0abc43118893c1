package lease

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/gpulet/gpulet/internal/clock"
)

// sameMap says whether a and b are one map, not merely equal ones.
func sameMap(a, b map[string]string) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// mpsFolders is a Config.InstanceEnv that puts the pipe folder of each
// instance under dir: dir/<GPU UUID>/<instance>.
func mpsFolders(f *fixture, dir string) [][]map[string]string {
	out := make([][]map[string]string, len(f.devs))
	for g, d := range f.devs {
		for k := range f.model.InstancesPerGPU {
			out[g] = append(out[g], map[string]string{"CUDA_MPS_PIPE_DIRECTORY": dir + "/" + d.UUID + "/" + strconv.Itoa(k)})
		}
	}
	return out
}

// TestAlikeLeasesShareOneEnvironment: leases of as many units on one instance,
// with the default memory limit, hold one environment map between them;
// every lease still shows what EnvFor makes for it, a changed MPS folder (a
// restart with another run dir, its leases taken back from the journal) is
// not hidden by a shared map, and a restart shows the same leases, byte for
// byte, sharing again.
func TestAlikeLeasesShareOneEnvironment(t *testing.T) {
	f := newFixture(t, 2, 4, 2) // 2 instances of 8 units on each GPU
	pipe := "/p1"
	withMPS := func(c *Config) {
		c.MPS = true
		c.Devices = c.Devices[:1]
		c.InstanceEnv = mpsFolders(f, pipe)
	}
	m := f.manager(t, withMPS)
	acquire := func(units int, memMiB uint64) Grant {
		t.Helper()
		req := ttlReq(units, "1h")
		req.MemoryMiB = memMiB
		g, err := m.Acquire(context.Background(), root, req)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	envOf := func(m *Manager, id string) map[string]string {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.leases[id].Env
	}
	// Three one-unit leases on two instances: two at least on one.
	ones := []Grant{acquire(1, 0), acquire(1, 0), acquire(1, 0)}
	oneEnvShared := func(when string) {
		t.Helper()
		shared := 0
		for i, a := range ones {
			for _, b := range ones[i+1:] {
				if a.Instance == b.Instance {
					shared++
					if !sameMap(envOf(m, a.ID), envOf(m, b.ID)) {
						t.Fatalf("%s, leases %s and %s of one unit on instance %d hold two environments", when, a.ID, b.ID, a.Instance)
					}
				}
			}
		}
		if shared == 0 {
			t.Fatalf("no two one-unit leases on one instance: %+v", ones)
		}
	}
	oneEnvShared("as granted")
	two := acquire(2, 0)
	pinned := acquire(1, 8000)
	m.Close()
	pipe = "/p2"
	m = f.manager(t, withMPS)
	oneEnvShared("taken back")
	moved := acquire(1, 0)
	for _, g := range append(append([]Grant{}, ones...), two, pinned, moved) {
		p := pipe
		if g.ID != moved.ID {
			p = "/p1"
		}
		want := EnvFor(f.model, f.devs[0], map[string]string{"CUDA_MPS_PIPE_DIRECTORY": p + "/" + f.devs[0].UUID + "/" + strconv.Itoa(g.Instance)}, true, len(g.Units), g.MemoryMiB)
		if got := envOf(m, g.ID); !maps.Equal(g.Env, want) || !maps.Equal(got, want) {
			t.Fatalf("lease %s of %d unit(s) on instance %d, memory %d: env %v (held: %v), want %v", g.ID, len(g.Units), g.Instance, g.MemoryMiB, g.Env, got, want)
		}
	}
	for _, a := range ones {
		if sameMap(envOf(m, a.ID), envOf(m, two.ID)) || sameMap(envOf(m, a.ID), envOf(m, pinned.ID)) || sameMap(envOf(m, a.ID), envOf(m, moved.ID)) {
			t.Fatalf("lease %s shares its environment with a lease of other units, memory or folders", a.ID)
		}
	}

	// The restart replays the journal's environments; the lease of the
	// changed folder goes first, so that every other finds its like.
	if err := m.Release(root, moved.ID); err != nil {
		t.Fatal(err)
	}
	before, err := json.Marshal(m.List(root))
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	m = f.manager(t, withMPS)
	after, err := json.Marshal(m.List(root))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Fatalf("leases before the restart\n%s\nand after\n%s", before, after)
	}
	oneEnvShared("after the restart")
}

// TestAnswersAreWhatJSONMakesOfTheLease: a grant's answer is the lease as
// encoding/json encodes it, and the same bytes as a read of the lease right
// after; a renewal publishes a changed copy, leaving what was read before
// (a grant's answer, an earlier view) as it was.
func TestAnswersAreWhatJSONMakesOfTheLease(t *testing.T) {
	f := newFixture(t, 1, 4, 1)
	c := clock.NewFake(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
	m := f.manager(t, func(cfg *Config) { cfg.Clock = c })
	req := ttlReq(1, "1m")
	req.Task = "train"
	g, err := m.Acquire(context.Background(), root, req)
	if err != nil {
		t.Fatal(err)
	}
	want, err := json.Marshal(&g.Lease)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(g.JSON, want) {
		t.Fatalf("grant answered\n%s\nencoding/json makes\n%s", g.JSON, want)
	}
	got, err := m.Get(root, g.ID)
	if err != nil {
		t.Fatal(err)
	}
	if read, _ := json.Marshal(&got); !bytes.Equal(read, g.JSON) {
		t.Fatalf("read after the grant\n%s\ngrant's answer\n%s", read, g.JSON)
	}

	seen := m.View().GPUs[g.GPU.Index].Leases[0]
	c.Advance(30 * time.Second)
	renewed, err := m.Renew(root, g.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !renewed.Expires.Equal(g.Expires.Add(30 * time.Second)) {
		t.Fatalf("renewed to %v, granted until %v", renewed.Expires, g.Expires)
	}
	if !seen.Expires.Equal(*g.Expires) || !got.Expires.Equal(*g.Expires) {
		t.Fatalf("a renewal changed what was read before it: view %v, read %v, granted %v", seen.Expires, got.Expires, g.Expires)
	}
	if now := m.View().GPUs[g.GPU.Index].Leases[0]; now == seen || !now.Expires.Equal(*renewed.Expires) {
		t.Fatalf("the view after the renewal shows %v", now.Expires)
	}
	again, err := m.Get(root, g.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again, renewed) {
		t.Fatalf("read after the renewal %+v, renewal answered %+v", again, renewed)
	}
}
