package replay

import (
	"strings"
	"testing"
)

func TestReadNodes(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []TraceNode
		err      string
	}{
		{name: "openb's columns", in: "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,96000,393216,8,G2\n",
			want: []TraceNode{{"n0", 64000, 262144, 2, "P100"}, {"n1", 96000, 393216, 8, "G2"}}},
		{name: "columns in another order, a BOM", in: "\ufeffmodel,gpu,sn,memory_mib,cpu_milli\nT4,2,n0,1024,1000\n", want: []TraceNode{{"n0", 1000, 1024, 2, "T4"}}},
		{name: "a CPU node", in: "sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1024,0,\n", want: []TraceNode{{"n0", 1000, 1024, 0, ""}}},
		{name: "empty", in: "", err: "empty file"},
		{name: "header only", in: "sn,cpu_milli,memory_mib,gpu,model\n", err: "no nodes"},
		{name: "a column missing", in: "sn,cpu_milli,gpu,model\nn0,1,1,T4\n", err: `no column "memory_mib"`},
		{name: "not a number", in: "sn,cpu_milli,memory_mib,gpu,model\nn0,lots,1,1,T4\n", err: `line 2: cpu_milli "lots"`},
		{name: "negative", in: "sn,cpu_milli,memory_mib,gpu,model\nn0,1,-1,1,T4\n", err: `memory_mib "-1"`},
		{name: "too many GPUs", in: "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,65,T4\n", err: `gpu "65"`},
		{name: "a node twice", in: "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,1,T4\nn0,1,1,1,T4\n", err: `line 3: sn "n0": listed twice`},
		{name: "GPUs of no model", in: "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,1,\n", err: "model: empty"},
		{name: "a short row", in: "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1\n", err: "wrong number of fields"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadNodes(strings.NewReader(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, %v; want an error saying %q", got, err, tc.err)
				}
				return
			}
			if err != nil || len(got) != len(tc.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("node %d: %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestReadPods(t *testing.T) {
	const header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n"
	for _, tc := range []struct {
		name, in string
		want     []Pod
		err      string
	}{
		{name: "shares, whole GPUs, none", in: header + "p0,6000,12288,1,460,,LS\np1,8000,1,8,1000,,BE\np2,1,1,0,0,,LS\n",
			want: []Pod{{Name: "p0", CPUMilli: 6000, MemoryMiB: 12288, GPUs: 1, GPUMilli: 460}, {Name: "p1", CPUMilli: 8000, MemoryMiB: 1, GPUs: 8, GPUMilli: 1000}, {Name: "p2", CPUMilli: 1, MemoryMiB: 1}}},
		{name: "models", in: header + "p0,1,1,1,500,V100M16|V100M32,LS\n", want: []Pod{{Name: "p0", CPUMilli: 1, MemoryMiB: 1, GPUs: 1, GPUMilli: 500, Models: []string{"V100M16", "V100M32"}}}},
		{name: "no gpu_spec column (multigpu20)", in: "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,2,1000\n", want: []Pod{{Name: "p0", CPUMilli: 1, MemoryMiB: 1, GPUs: 2, GPUMilli: 1000}}},
		{name: "more than a GPU", in: header + "p0,1,1,1,1001,,LS\n", err: `gpu_milli "1001"`},
		{name: "a share of nothing", in: header + "p0,1,1,1,0,,LS\n", err: "gpu_milli: 0 for a pod of one GPU"},
		{name: "an empty model", in: header + "p0,1,1,1,10,T4|,LS\n", err: "an empty model"},
		{name: "a bare quote", in: header + "p0,\"1,1,1,10,,LS\n", err: "line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadPods(strings.NewReader(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, %v; want an error saying %q", got, err, tc.err)
				}
				return
			}
			if err != nil || len(got) != len(tc.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
			for i := range got {
				if g, w := got[i], tc.want[i]; g.Name != w.Name || g.CPUMilli != w.CPUMilli || g.MemoryMiB != w.MemoryMiB || g.GPUs != w.GPUs || g.GPUMilli != w.GPUMilli || strings.Join(g.Models, "|") != strings.Join(w.Models, "|") {
					t.Errorf("pod %d: %+v, want %+v", i, g, w)
				}
			}
		})
	}
}

// FuzzReadTrace: any input is read or refused with an error, never a panic,
// and what is read keeps the limits the replay counts on.
func FuzzReadTrace(f *testing.F) {
	f.Add("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\n")
	f.Add("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,6000,12288,1,460,T4|P100\n")
	f.Add("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,8,1000\n")
	f.Add("\ufeffsn,model,gpu,cpu_milli,memory_mib\n\"n\"\"0\",T4,1,1,1\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, in string) {
		if nodes, err := ReadNodes(strings.NewReader(in)); err == nil {
			for _, n := range nodes {
				if n.GPUs > maxGPUsPerPod || n.CPUMilli > maxCPUMilli || n.MemoryMiB > maxMemoryMiB || n.Name == "" {
					t.Fatalf("read a node past the limits: %+v", n)
				}
			}
		}
		if pods, err := ReadPods(strings.NewReader(in)); err == nil {
			for _, p := range pods {
				if p.GPUs > maxGPUsPerPod || p.GPUMilli > 1000 || p.GPUs == 1 && p.GPUMilli == 0 || p.Milli() < 0 {
					t.Fatalf("read a pod past the limits: %+v", p)
				}
			}
		}
	})
}
