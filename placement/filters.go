package placement

import (
	"fmt"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/errdefs"
	"github.com/gpulet/gpulet/pipefile"
)

// resolveGPU finds the GPU a request names by index or UUID: its position in
// n.GPUs, or -1 when the request names none.
func resolveGPU(n *Node, sel string) (int, error) {
	if sel == "" {
		return -1, nil
	}
	i, err := api.FindGPU(sel, len(n.GPUs), func(i int) (int, string) { return n.GPUs[i].Index, n.GPUs[i].UUID })
	if err != nil {
		return 0, errdefs.Errorf(errdefs.ErrInvalid, "gpu: %v", err)
	}
	return i, nil
}

// reason is why a GPU or an instance was left out, kept as values and made
// into words only when someone reads them. The words follow "GPU 3 ": "is 95%
// busy", "instance 0 is down": a decision on a large node passes
// over many full instances, and must not format a message for each.
type reason struct {
	kind       reasonKind
	instance   int
	have, want uint64
	// text is the GPU's own word on why it is unusable, or the type asked.
	text string
	name string
}

type reasonKind uint8

const (
	fits reasonKind = iota
	wrongType
	memoryTotal
	ccBelow
	noInstanceSize
	unusable
	memoryFree
	gpuUnitsFree
	instanceDown
	instanceUnitsFree
	instanceClients
	instanceOtherUser
	notInPool
	poolsForbidden
	notWhole
	instanceHasClients
	memoryShareFree
)

func (r reason) String() string {
	switch r.kind {
	case wrongType:
		return fmt.Sprintf("(%s) is not of type %q", r.name, r.text)
	case memoryTotal:
		return fmt.Sprintf("has %d MiB in all, less than the %d MiB asked", r.have, r.want)
	case ccBelow:
		have, want := unpackCC(r.have), unpackCC(r.want)
		if have.IsZero() {
			return fmt.Sprintf("has a compute capability its driver does not report, so not the %s asked", want)
		}
		return fmt.Sprintf("has compute capability %s, below the %s asked", have, want)
	case noInstanceSize:
		return fmt.Sprintf("has no MPS instance of %d units", r.want)
	case unusable:
		return r.text
	case memoryFree:
		return fmt.Sprintf("has %d MiB free, less than the %d MiB asked", r.have, r.want)
	case memoryShareFree:
		return fmt.Sprintf("has %d MiB free, less than the units' share of %d MiB", r.have, r.want)
	case gpuUnitsFree:
		return fmt.Sprintf("has %d unit(s) free", r.have)
	case instanceDown:
		return fmt.Sprintf("instance %d %s", r.instance, r.text)
	case instanceUnitsFree:
		return fmt.Sprintf("instance %d has %d unit(s) free", r.instance, r.have)
	case instanceClients:
		return fmt.Sprintf("instance %d has its %d clients", r.instance, r.have)
	case instanceOtherUser:
		return fmt.Sprintf("instance %d serves another user's MPS clients", r.instance)
	case notInPool:
		return fmt.Sprintf("is not in pool %s", r.text)
	case poolsForbidden:
		return fmt.Sprintf("is only in pools you may not use (%s)", r.text)
	case notWhole:
		return fmt.Sprintf("is not whole: %d of its %d unit(s) free", r.have, r.want)
	case instanceHasClients:
		return fmt.Sprintf("is not whole: instance %d has %d MPS client(s)", r.instance, r.have)
	}
	return ""
}

// never says why g can never take r, whatever its load.
func never(g *GPU, r Request) reason {
	switch {
	case !api.MatchType(r.Type, g.Name):
		return reason{kind: wrongType, name: g.Name, text: r.Type}
	case r.MemoryMiB > g.MemoryTotalMiB:
		return reason{kind: memoryTotal, have: g.MemoryTotalMiB, want: r.MemoryMiB}
	case g.Card.CC.Less(r.MinCC):
		// A card's compute capability is what it is: never, not now. An
		// unknown one (zero) is below any asked, since nothing says it
		// reaches it.
		return reason{kind: ccBelow, have: packCC(g.Card.CC), want: packCC(r.MinCC)}
	}
	for _, in := range g.Instances {
		if in.Size >= r.Units {
			return reason{}
		}
	}
	return reason{kind: noInstanceSize, want: uint64(r.Units)}
}

// packCC keeps a compute capability in a reason's have or want: reasons are
// made for every instance a decision passes over, and stay small.
func packCC(c api.ComputeCapability) uint64 {
	return uint64(uint32(c.Major))<<32 | uint64(uint32(c.Minor))
}

func unpackCC(v uint64) api.ComputeCapability {
	return api.ComputeCapability{Major: int(v >> 32), Minor: int(uint32(v))}
}

// gpuNow says why g cannot take r now.
func gpuNow(g *GPU, r Request) reason {
	switch {
	case g.Unusable != "":
		return reason{kind: unusable, text: g.Unusable}
	case r.MemoryMiB > g.MemoryFreeMiB:
		return reason{kind: memoryFree, have: g.MemoryFreeMiB, want: r.MemoryMiB}
	case g.Free < r.Units:
		return reason{kind: gpuUnitsFree, have: uint64(g.Free)}
	}
	// A request that asks no memory gets its units' share as its limit
	// (docs/design.md §1.8): that much must be free too. It is looked
	// at after the units, so that a full GPU still says its units are.
	if r.MemoryMiB == 0 && g.Units > 0 {
		if share := pipefile.MemoryShareMiB(r.Units, g.Units, g.MemoryTotalMiB); share > g.MemoryFreeMiB {
			return reason{kind: memoryShareFree, have: g.MemoryFreeMiB, want: share}
		}
	}
	return reason{}
}

// instanceNow says why instance k of the GPU at position g cannot take r now.
func instanceNow(n *Node, b *binding, g, k int, r Request) reason {
	in := &n.GPUs[g].Instances[k]
	switch {
	case in.Down != "":
		return reason{kind: instanceDown, instance: in.Index, text: in.Down}
	case len(in.FreeUnits) < r.Units:
		return reason{kind: instanceUnitsFree, instance: in.Index, have: uint64(len(in.FreeUnits))}
	case in.Clients >= n.ClientsPerInstance:
		return reason{kind: instanceClients, instance: in.Index, have: uint64(n.ClientsPerInstance)}
	case n.OneUserPerInstance && b.servesOthers(g, k, r.UID):
		return reason{kind: instanceOtherUser, instance: in.Index}
	}
	return reason{}
}

// ServesOthers reports whether an instance serving users (each once) serves
// a user other than uid: with MPS on, uid may not join it. Two or more users
// always include another.
func ServesOthers(users []uint32, uid uint32) bool {
	return len(users) > 1 || len(users) == 1 && users[0] != uid
}
