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

// TestAlikeLeasesShareOneEnvironment: leases of as many units on one instance,
// with the default memory limit, hold one environment map between them;
// every lease still shows what EnvFor makes for it, a changed MPS folder is
// not hidden by a shared map, and a restart shows the same leases, byte for
// byte, sharing again.
func TestAlikeLeasesShareOneEnvironment(t *testing.T) {
	f := newFixture(t, 2, 4, 2) // 2 instances of 8 units on each GPU
	pipe := "/p1"
	instanceEnv := func(g, k int) map[string]string {
		return map[string]string{"CUDA_MPS_PIPE_DIRECTORY": pipe + "/" + f.devs[g].UUID + "/" + strconv.Itoa(k)}
	}
	withMPS := func(c *Config) {
		c.MPS = true
		c.Devices = c.Devices[:1]
		c.InstanceEnv = func(g, k int) map[string]string { return instanceEnv(g, k) }
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
	// Three one-unit leases on two instances: two at least on one.
	ones := []Grant{acquire(1, 0), acquire(1, 0), acquire(1, 0)}
	two := acquire(2, 0)
	pinned := acquire(1, 8000)
	pipe = "/p2"
	moved := acquire(1, 0)
	all := append(append([]Grant{}, ones...), two, pinned, moved)

	envOf := func(m *Manager, id string) map[string]string {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.leases[id].Env
	}
	for _, g := range all {
		p := pipe
		if g.ID != moved.ID {
			p = "/p1"
		}
		want := EnvFor(f.model, f.devs[0], map[string]string{"CUDA_MPS_PIPE_DIRECTORY": p + "/" + f.devs[0].UUID + "/" + strconv.Itoa(g.Instance)}, true, len(g.Units), g.MemoryMiB)
		if !maps.Equal(g.Env, want) {
			t.Fatalf("lease %s of %d unit(s) on instance %d, memory %d: env %v, want %v", g.ID, len(g.Units), g.Instance, g.MemoryMiB, g.Env, want)
		}
	}
	shared := 0
	for i, a := range ones {
		for _, b := range ones[i+1:] {
			if a.Instance == b.Instance {
				shared++
				if !sameMap(envOf(m, a.ID), envOf(m, b.ID)) {
					t.Fatalf("leases %s and %s of one unit on instance %d hold two environments", a.ID, b.ID, a.Instance)
				}
			}
		}
		if sameMap(envOf(m, a.ID), envOf(m, two.ID)) || sameMap(envOf(m, a.ID), envOf(m, pinned.ID)) || sameMap(envOf(m, a.ID), envOf(m, moved.ID)) {
			t.Fatalf("lease %s shares its environment with a lease of other units, memory or folders", a.ID)
		}
	}
	if shared == 0 {
		t.Fatalf("no two one-unit leases on one instance: %+v", ones)
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
	for i, a := range ones {
		for _, b := range ones[i+1:] {
			if a.Instance == b.Instance && !sameMap(envOf(m, a.ID), envOf(m, b.ID)) {
				t.Fatalf("after the restart, leases %s and %s hold two environments", a.ID, b.ID)
			}
		}
	}
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
