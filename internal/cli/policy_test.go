package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
)

func TestWriteAccess(t *testing.T) {
	var b bytes.Buffer
	writeAccess(&b, &api.PoolList{Pools: []api.Pool{}}, &api.QuotaList{Quotas: []api.QuotaUsage{}})
	if b.Len() != 0 {
		t.Fatalf("no pools and no quotas printed %q", b.String())
	}
	writeAccess(&b, &api.PoolList{Pools: []api.Pool{{Name: "training", GPUs: []int{0, 1}, UnitsFree: 12, Allowed: true}, {Name: "infer", GPUs: []int{2}}}},
		&api.QuotaList{Quotas: []api.QuotaUsage{{Quota: "alice", Limit: 8, Held: 2}, {Quota: "*", Limit: 64, Held: 30, Reserved: 4}}})
	for _, want := range []string{"POOL      GPUS  FREE  YOU", "training  0,1   12    may use", "infer     2     0     may not use", "your quotas (held/limit): alice 2/8, * 30+4 reserved/64"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in\n%s", want, b.String())
		}
	}
	b.Reset()
	writeAccess(&b, &api.PoolList{Pools: []api.Pool{{Name: "p", GPUs: []int{0}}}}, &api.QuotaList{Admin: true, Quotas: []api.QuotaUsage{}})
	if !strings.Contains(b.String(), "none bind you (admin)") {
		t.Errorf("admin: %q", b.String())
	}
	b.Reset()
	writeAccess(&b, &api.PoolList{Pools: []api.Pool{}, SkippedRules: []string{`line 6: quotas.bob: no user "bob" on this machine; the quota is skipped`}}, &api.QuotaList{Quotas: []api.QuotaUsage{}})
	if !strings.Contains(b.String(), "config rules skipped") || !strings.Contains(b.String(), "  line 6: quotas.bob:") {
		t.Errorf("skipped rules: %q", b.String())
	}
}

func TestWriteProfiles(t *testing.T) {
	var b bytes.Buffer
	WriteProfiles(&b, &api.ProfileList{})
	if !strings.Contains(b.String(), "no task profiles") {
		t.Fatalf("empty table: %q", b.String())
	}
	b.Reset()
	WriteProfiles(&b, &api.ProfileList{Profiles: []api.TaskProfile{{Task: "resnet50", Models: []api.ModelRunTime{
		{Model: "NVIDIA A100-SXM4-80GB", Seconds: 95, Runs: 0}, {Model: "Tesla T4", Seconds: 410.25, Runs: 3}}}}})
	want := "TASK      MODEL                  RUN TIME  RUNS\nresnet50  NVIDIA A100-SXM4-80GB  1m35s     0\nresnet50  Tesla T4               6m50.25s  3\n"
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestOverQuotaNotes(t *testing.T) {
	var b bytes.Buffer
	WriteStatus(&b, &api.Snapshot{Node: "n", OverQuota: []api.QuotaOver{{Quota: "alice", Limit: 4, Held: 13}}})
	if !strings.Contains(b.String(), "quota alice: 13 unit(s) held, over its limit of 4 (offline claims count too): no new lease for it until back under") {
		t.Fatalf("status:\n%s", b.String())
	}
}
