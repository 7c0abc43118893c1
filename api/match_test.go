package api

import "testing"

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		name, gpu, typ string
		index          int
		uuid, gpuName  string
		want           bool
	}{
		{name: "anything", index: 1, uuid: "GPU-b", gpuName: "Tesla T4", want: true},
		{name: "by index", gpu: "1", index: 1, uuid: "GPU-b", gpuName: "Tesla T4", want: true},
		{name: "other index", gpu: "0", index: 1, uuid: "GPU-b", gpuName: "Tesla T4"},
		{name: "by uuid in any case", gpu: "gpu-B", index: 1, uuid: "GPU-b", gpuName: "Tesla T4", want: true},
		{name: "other uuid", gpu: "GPU-a", index: 1, uuid: "GPU-b", gpuName: "Tesla T4"},
		{name: "part of a uuid", gpu: "GPU", index: 1, uuid: "GPU-b", gpuName: "Tesla T4"},
		{name: "type in any case", typ: "t4", index: 1, uuid: "GPU-b", gpuName: "Tesla T4", want: true},
		{name: "type with a space", typ: "h100 80gb", index: 0, uuid: "GPU-h", gpuName: "NVIDIA H100 80GB HBM3", want: true},
		{name: "other type", typ: "A100", index: 1, uuid: "GPU-b", gpuName: "Tesla T4"},
		{name: "index and type", gpu: "1", typ: "T4", index: 1, uuid: "GPU-b", gpuName: "Tesla T4", want: true},
		{name: "index but not type", gpu: "1", typ: "A100", index: 1, uuid: "GPU-b", gpuName: "Tesla T4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := MatchGPU(tc.gpu, tc.index, tc.uuid) && MatchType(tc.typ, tc.gpuName)
			if got != tc.want {
				t.Fatalf("gpu %q type %q on GPU %d %s %q: %v, want %v", tc.gpu, tc.typ, tc.index, tc.uuid, tc.gpuName, got, tc.want)
			}
		})
	}
	if n, ok := GPUIndex("3"); !ok || n != 3 {
		t.Fatal("GPUIndex(3)")
	}
	if _, ok := GPUIndex("GPU-3"); ok {
		t.Fatal("a UUID taken for an index")
	}
}
