package replay

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// TraceNode is one node of a node list (openb_node_list_gpu_node.csv:
// sn,cpu_milli,memory_mib,gpu,model).
type TraceNode struct {
	Name      string
	CPUMilli  uint64
	MemoryMiB uint64
	GPUs      int
	Model     string
}

// Pod is one pod of a pod list (openb_pod_list_*.csv: name, cpu_milli,
// memory_mib, num_gpu, gpu_milli and, in some lists, gpu_spec).
type Pod struct {
	Name      string
	CPUMilli  uint64
	MemoryMiB uint64
	// GPUs is num_gpu: 0–8. With 1, GPUMilli is the share of the GPU
	// (1000: all of it); with more, the pod takes that many whole GPUs.
	GPUs     int
	GPUMilli int
	// Models are the GPU models the pod accepts (gpu_spec, split at
	// "|"); empty: any.
	Models []string
}

// Milli is the GPU the pod asks, in thousandths of a GPU.
func (p Pod) Milli() int {
	switch {
	case p.GPUs == 1:
		return p.GPUMilli
	case p.GPUs > 1:
		return 1000 * p.GPUs
	}
	return 0
}

// maxGPUsPerPod bounds num_gpu and a node's gpu: the trace's largest
// nodes have 8; more is a damaged file, not a bigger machine.
const maxGPUsPerPod = 64

// columns finds each wanted column in header, by name; optional ones may be
// absent (-1).
func columns(header []string, required, optional []string) (map[string]int, error) {
	at := map[string]int{}
	for i, h := range header {
		at[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	out := map[string]int{}
	for _, name := range required {
		i, ok := at[name]
		if !ok {
			return nil, fmt.Errorf("header: no column %q (the header is %q)", name, strings.Join(header, ","))
		}
		out[name] = i
	}
	for _, name := range optional {
		if i, ok := at[name]; ok {
			out[name] = i
		} else {
			out[name] = -1
		}
	}
	return out, nil
}

// rows reads a CSV file with a header and calls each for every row, with
// its line number for messages.
func rows(r io.Reader, required, optional []string, each func(line int, col func(string) string) error) error {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return errors.New("empty file: want a header line")
	}
	if err != nil {
		return err
	}
	at, err := columns(append([]string(nil), header...), required, optional)
	if err != nil {
		return err
	}
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		line, _ := cr.FieldPos(0)
		col := func(name string) string {
			if i := at[name]; i >= 0 {
				return strings.TrimSpace(rec[i])
			}
			return ""
		}
		if err := each(line, col); err != nil {
			return fmt.Errorf("line %d: %w", line, err)
		}
	}
}

func number(col func(string) string, name string, limit uint64) (uint64, error) {
	v, err := strconv.ParseUint(col(name), 10, 64)
	if err != nil || v > limit {
		return 0, fmt.Errorf("%s %q: want a whole number from 0 to %d", name, col(name), limit)
	}
	return v, nil
}

// The limits of a node's or pod's CPU and memory: far above any machine, low
// enough that sums over a cluster cannot overflow.
const (
	maxCPUMilli  = 1 << 32
	maxMemoryMiB = 1 << 40
)

// ReadNodes reads a node list.
func ReadNodes(r io.Reader) ([]TraceNode, error) {
	var out []TraceNode
	seen := map[string]bool{}
	err := rows(r, []string{"sn", "cpu_milli", "memory_mib", "gpu", "model"}, nil, func(_ int, col func(string) string) error {
		n := TraceNode{Name: col("sn"), Model: col("model")}
		var err error
		if n.Name == "" {
			return errors.New("sn: empty")
		}
		if seen[n.Name] {
			return fmt.Errorf("sn %q: listed twice", n.Name)
		}
		seen[n.Name] = true
		if n.CPUMilli, err = number(col, "cpu_milli", maxCPUMilli); err != nil {
			return err
		}
		if n.MemoryMiB, err = number(col, "memory_mib", maxMemoryMiB); err != nil {
			return err
		}
		gpus, err := number(col, "gpu", maxGPUsPerPod)
		if err != nil {
			return err
		}
		n.GPUs = int(gpus)
		if n.GPUs > 0 && n.Model == "" {
			return errors.New("model: empty for a node with GPUs")
		}
		out = append(out, n)
		return nil
	})
	if err == nil && len(out) == 0 {
		err = errors.New("no nodes")
	}
	return out, err
}

// ReadPods reads a pod list.
func ReadPods(r io.Reader) ([]Pod, error) {
	var out []Pod
	err := rows(r, []string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}, []string{"gpu_spec"}, func(_ int, col func(string) string) error {
		p := Pod{Name: col("name")}
		var err error
		if p.CPUMilli, err = number(col, "cpu_milli", maxCPUMilli); err != nil {
			return err
		}
		if p.MemoryMiB, err = number(col, "memory_mib", maxMemoryMiB); err != nil {
			return err
		}
		gpus, err := number(col, "num_gpu", maxGPUsPerPod)
		if err != nil {
			return err
		}
		milli, err := number(col, "gpu_milli", 1000)
		if err != nil {
			return err
		}
		p.GPUs, p.GPUMilli = int(gpus), int(milli)
		if p.GPUs == 1 && p.GPUMilli == 0 {
			return errors.New("gpu_milli: 0 for a pod of one GPU; want 1 to 1000")
		}
		if spec := col("gpu_spec"); spec != "" {
			for _, m := range strings.Split(spec, "|") {
				if m = strings.TrimSpace(m); m == "" {
					return fmt.Errorf("gpu_spec %q: an empty model", spec)
				}
				p.Models = append(p.Models, m)
			}
		}
		out = append(out, p)
		return nil
	})
	if err == nil && len(out) == 0 {
		err = errors.New("no pods")
	}
	return out, err
}
