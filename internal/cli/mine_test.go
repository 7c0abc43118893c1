package cli

import (
	"bytes"
	"testing"

	"github.com/gpulet/gpulet/api"
)

func TestNotForYou(t *testing.T) {
	other, me := uint32(4294967294), uint32(1000)
	s := &api.Snapshot{GPUs: []api.GPU{
		{Index: 0, UnitsFree: 8, Instances: []api.Instance{{Instance: 0, UnitsFree: 8, UID: &other}, {Instance: 1, UnitsFree: 0, UID: &other}}},
		{Index: 1, UnitsFree: 4, Instances: []api.Instance{{Instance: 0, UnitsFree: 4}}},
		{Index: 2, UnitsFree: 16, Instances: []api.Instance{{Instance: 0, UnitsFree: 16, UID: &me}}},
		{Index: 3, UnitsFree: 0, Instances: []api.Instance{{Instance: 0, UID: &other}}},
	}}
	pools := &api.PoolList{Pools: []api.Pool{{Name: "training", GPUs: []int{1}}, {Name: "mine", GPUs: []int{2}, Allowed: true}}}
	quotas := &api.QuotaList{Quotas: []api.QuotaUsage{{Quota: "alice", Limit: 4, Held: 3, Reserved: 1}, {Quota: "group:ml", Limit: 8, Held: 2}}}
	var b bytes.Buffer
	writeNotForYou(&b, notForYou(s, pools, quotas, me))
	want := "\nfree, but not for you:\n" +
		"  GPU 0 instance 0: its 8 free unit(s) are not yours now: its MPS server serves 4294967294, and an MPS server serves one user at a time\n" +
		"  GPU 1: its 4 free unit(s) are in pool training, which you may not use\n" +
		"  quota alice: 4 of its 4 unit(s) are held: no free unit is yours until some are released\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	b.Reset()
	writeNotForYou(&b, notForYou(s, nil, &api.QuotaList{Admin: true, Quotas: quotas.Quotas}, other))
	if want := "\nfree, but not for you:\n  GPU 2 instance 0: its 16 free unit(s) are not yours now: its MPS server serves 1000, and an MPS server serves one user at a time\n"; b.String() != want && !bytes.Contains(b.Bytes(), []byte("GPU 2 instance 0: its 16 free unit(s) are not yours now: its MPS server serves ")) {
		t.Errorf("as the other user, an admin:\n%s", b.String())
	}
}
