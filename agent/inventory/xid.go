package inventory

import (
	"fmt"
	"sync"
)

// Xid events are the GPU driver's error reports. The rule gpulet applies to a
// critical Xid event, as NVIDIA's Kubernetes device plugin does: the GPU is
// failed, unless the Xid is one that a faulty application causes and the GPU
// survives (applicationXids), which is logged and ignored. An Xid that is in
// neither table is treated as a GPU fault: an unknown fault keeps new work off
// the GPU until an admin has looked, rather than sending work to a broken card.

// applicationXids are the Xids of application errors: the GPU is fine and the
// next program runs normally. Any local user can cause them with a faulty
// kernel, so they must not take a GPU out of service.
var applicationXids = map[uint64]bool{
	13:  true,
	31:  true,
	43:  true,
	45:  true,
	68:  true,
	109: true,
}

// xidMeanings are short descriptions of well-known Xids, after NVIDIA's Xid
// catalogue, for the log and the snapshot.
var xidMeanings = map[uint64]string{
	13:  "graphics engine exception",
	31:  "GPU memory page fault",
	43:  "GPU stopped processing",
	45:  "preemptive cleanup, due to previous errors",
	48:  "double-bit ECC error",
	61:  "internal micro-controller breakpoint",
	62:  "internal micro-controller halt",
	63:  "ECC page retirement or row remapping recorded",
	64:  "ECC page retirement or row remapping failed",
	68:  "video processor exception",
	69:  "graphics engine class error",
	74:  "NVLink error",
	79:  "GPU has fallen off the bus",
	92:  "high single-bit ECC error rate",
	94:  "contained ECC error",
	95:  "uncontained ECC error",
	109: "context switch timeout",
	119: "GSP RPC timeout",
	120: "GSP error",
	140: "unrecovered ECC error",
}

// XidCritical reports whether a critical Xid event with this Xid fails the GPU.
func XidCritical(xid uint64) bool { return xid != 0 && !applicationXids[xid] }

// XidMeaning describes an Xid in a few words.
func XidMeaning(xid uint64) string {
	if m, ok := xidMeanings[xid]; ok {
		return m
	}
	return "GPU error (see NVIDIA's Xid catalogue)"
}

// XidError is the error of a GPU failed by a critical Xid.
type XidError struct{ Xid uint64 }

func (e *XidError) Error() string { return fmt.Sprintf("Xid %d: %s", e.Xid, XidMeaning(e.Xid)) }

// xidFaults latches the critical Xid of each GPU. A latched Xid is cleared only
// by an admin (ClearXid) or a restart, never by a good sample: a GPU that fell
// off the bus once may read well between faults, and work placed there would
// be lost.
type xidFaults struct {
	mu  sync.Mutex // guards xid
	xid []uint64   // by GPU index; 0: none
}

func newXidFaults(n int) *xidFaults { return &xidFaults{xid: make([]uint64, n)} }

// record latches xid on GPU i if it is critical and GPU i has none yet: the
// first fault is kept, as later ones often follow from it.
func (f *xidFaults) record(i int, xid uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i >= 0 && i < len(f.xid) && f.xid[i] == 0 && XidCritical(xid) {
		f.xid[i] = xid
	}
}

// clear drops GPU i's Xid and returns it (0: there was none).
func (f *xidFaults) clear(i int) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i < 0 || i >= len(f.xid) {
		return 0
	}
	x := f.xid[i]
	f.xid[i] = 0
	return x
}

// apply marks s failed with GPU i's Xid, if it has one. The Xid is the
// reason shown even when an NVML call failed too: it says more.
func (f *xidFaults) apply(i int, s *Sample) {
	f.mu.Lock()
	x := f.xid[i]
	f.mu.Unlock()
	if x != 0 {
		s.Err = &XidError{Xid: x}
		s.Xid = x
	}
}
