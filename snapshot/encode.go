package snapshot

import (
	"encoding/json"
	"strconv"
	"sync"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/jsonenc"
)

// appendSnapshotJSON appends s as encoding/json encodes it (tests hold it to
// the same bytes, for every field of the types it walks). Under lease churn a
// snapshot is encoded again for nearly every read, and its GPUs, with their
// instances' unit lists, are most of its bytes: encoding/json's reflection
// over them cost readers several times what the bytes do. The parts that are
// rare or small (the view, upstreams, reservations, offline_by_uid) and a
// time encoding/json would refuse go through encoding/json itself. parts,
// when not nil, hold each GPU's encoding (GPUPart).
func appendSnapshotJSON(b []byte, s *api.Snapshot, parts []*GPUPart) ([]byte, error) {
	if !jsonenc.TimeOK(s.Time) {
		j, err := json.Marshal(s)
		return append(b, j...), err
	}
	b = append(b, `{"schema":`...)
	b = jsonenc.String(b, s.Schema)
	b = append(b, `,"node":`...)
	b = jsonenc.String(b, s.Node)
	b = append(b, `,"boot_id":`...)
	b = jsonenc.String(b, s.BootID)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, s.Seq, 10)
	b = append(b, `,"time":`...)
	b = jsonenc.Time(b, s.Time)
	b = append(b, `,"state":`...)
	b = jsonenc.String(b, s.State)
	b = append(b, `,"backend":`...)
	b = jsonenc.String(b, s.Backend)
	b = append(b, `,"mps":`...)
	b = jsonenc.String(b, s.MPS)
	b = append(b, `,"version":`...)
	b = jsonenc.String(b, s.Version)
	b = append(b, `,"commit":`...)
	b = jsonenc.String(b, s.Commit)
	b = append(b, `,"units_total":`...)
	b = strconv.AppendInt(b, int64(s.UnitsTotal), 10)
	b = append(b, `,"units_free":`...)
	b = strconv.AppendInt(b, int64(s.UnitsFree), 10)
	b = append(b, `,"units_reserved":`...)
	b = strconv.AppendInt(b, int64(s.UnitsReserved), 10)
	b = append(b, `,"gpus":`...)
	if s.GPUs == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range s.GPUs {
			if i > 0 {
				b = append(b, ',')
			}
			if i < len(parts) && parts[i] != nil {
				part, err := parts[i].encode(&s.GPUs[i])
				if err != nil {
					return b, err
				}
				b = append(b, part...)
				continue
			}
			var err error
			if b, err = appendGPU(b, &s.GPUs[i]); err != nil {
				return b, err
			}
		}
		b = append(b, ']')
	}
	var err error
	if s.View != nil {
		if b, err = appendMarshaled(b, `,"view":`, s.View); err != nil {
			return b, err
		}
	}
	b = jsonenc.OptionalString(b, `,"reason":`, s.Reason)
	if len(s.Upstreams) > 0 {
		if b, err = appendMarshaled(b, `,"upstreams":`, s.Upstreams); err != nil {
			return b, err
		}
	}
	if len(s.Reservations) > 0 {
		if b, err = appendMarshaled(b, `,"reservations":`, s.Reservations); err != nil {
			return b, err
		}
	}
	if len(s.OverQuota) > 0 {
		if b, err = appendMarshaled(b, `,"over_quota":`, s.OverQuota); err != nil {
			return b, err
		}
	}
	if s.ConfigError != "" {
		b = append(b, `,"config_error":`...)
		b = jsonenc.String(b, s.ConfigError)
	}
	return append(b, '}'), nil
}

func appendGPU(b []byte, g *api.GPU) ([]byte, error) {
	b = append(b, `{"index":`...)
	b = strconv.AppendInt(b, int64(g.Index), 10)
	b = append(b, `,"uuid":`...)
	b = jsonenc.String(b, g.UUID)
	b = append(b, `,"name":`...)
	b = jsonenc.String(b, g.Name)
	b = append(b, `,"state":`...)
	b = jsonenc.String(b, g.State)
	b = append(b, `,"eligible":`...)
	b = strconv.AppendBool(b, g.Eligible)
	b = append(b, `,"units_total":`...)
	b = strconv.AppendInt(b, int64(g.UnitsTotal), 10)
	b = append(b, `,"units_used":`...)
	b = strconv.AppendInt(b, int64(g.UnitsUsed), 10)
	b = append(b, `,"units_free":`...)
	b = strconv.AppendInt(b, int64(g.UnitsFree), 10)
	b = append(b, `,"units_offline":`...)
	b = strconv.AppendInt(b, int64(g.UnitsOffline), 10)
	b = append(b, `,"units_reserved":`...)
	b = strconv.AppendInt(b, int64(g.UnitsReserved), 10)
	b = append(b, `,"utilization_pct":`...)
	b = strconv.AppendInt(b, int64(g.UtilizationPct), 10)
	b = append(b, `,"utilization_source":`...)
	b = jsonenc.String(b, g.UtilizationSource)
	b = append(b, `,"kernel_time_pct":`...)
	b = strconv.AppendInt(b, int64(g.KernelTimePct), 10)
	b = append(b, `,"max_utilization_pct":`...)
	b = strconv.AppendInt(b, int64(g.MaxUtilizationPct), 10)
	b = append(b, `,"memory_total_mib":`...)
	b = strconv.AppendUint(b, g.MemoryTotalMiB, 10)
	b = append(b, `,"memory_used_mib":`...)
	b = strconv.AppendUint(b, g.MemoryUsedMiB, 10)
	b = append(b, `,"memory_held_mib":`...)
	b = strconv.AppendUint(b, g.MemoryHeldMiB, 10)
	b = append(b, `,"instances":`...)
	if g.Instances == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range g.Instances {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendInstance(b, &g.Instances[i])
		}
		b = append(b, ']')
	}
	b = append(b, `,"outside_memory_mib":`...)
	b = strconv.AppendUint(b, g.OutsideMemoryMiB, 10)
	var err error
	// The accounting's parts are rare or small: encoding/json writes them.
	if len(g.OutsideProcesses) > 0 {
		if b, err = appendMarshaled(b, `,"outside_processes":`, g.OutsideProcesses); err != nil {
			return b, err
		}
	}
	if g.OutsideOverShare {
		b = append(b, `,"outside_over_share":true`...)
	}
	if g.LeasesOverShare != 0 {
		b = append(b, `,"leases_over_share":`...)
		b = strconv.AppendInt(b, int64(g.LeasesOverShare), 10)
	}
	if len(g.Claims) > 0 {
		if b, err = appendMarshaled(b, `,"claims":`, g.Claims); err != nil {
			return b, err
		}
	}
	if len(g.OfflineByUID) > 0 {
		if b, err = appendMarshaled(b, `,"offline_by_uid":`, g.OfflineByUID); err != nil {
			return b, err
		}
	}
	b = jsonenc.OptionalString(b, `,"error":`, g.Error)
	if g.Xid != 0 {
		b = append(b, `,"xid":`...)
		b = strconv.AppendUint(b, g.Xid, 10)
	}
	c := &g.Capability
	b = append(b, `,"capability":{"compute_capability":`...)
	b = jsonenc.String(b, c.ComputeCapability)
	if c.Cores != 0 {
		b = append(b, `,"cores":`...)
		b = strconv.AppendInt(b, int64(c.Cores), 10)
	}
	b = append(b, `,"max_sm_clock_mhz":`...)
	b = strconv.AppendInt(b, int64(c.MaxSMClockMHz), 10)
	b = append(b, `,"memory_bus_width_bits":`...)
	b = strconv.AppendInt(b, int64(c.MemoryBusWidthBit), 10)
	b = append(b, `,"memory_clock_mhz":`...)
	b = strconv.AppendInt(b, int64(c.MemoryClockMHz), 10)
	b = append(b, `,"memory_bandwidth_gbps":`...)
	b = strconv.AppendInt(b, int64(c.MemoryBandwidthGBps), 10)
	return append(b, "}}"...), nil
}

func appendInstance(b []byte, in *api.Instance) []byte {
	b = append(b, `{"instance":`...)
	b = strconv.AppendInt(b, int64(in.Instance), 10)
	b = append(b, `,"state":`...)
	b = jsonenc.String(b, in.State)
	b = append(b, `,"clients":`...)
	b = strconv.AppendInt(b, int64(in.Clients), 10)
	b = append(b, `,"clients_max":`...)
	b = strconv.AppendInt(b, int64(in.ClientsMax), 10)
	b = append(b, `,"units":`...)
	b = appendUnits(b, in.Units)
	b = append(b, `,"units_free":`...)
	b = strconv.AppendInt(b, int64(in.UnitsFree), 10)
	if in.UID != nil {
		b = append(b, `,"uid":`...)
		b = strconv.AppendUint(b, uint64(*in.UID), 10)
	}
	if in.SMPct != nil {
		b = append(b, `,"sm_pct":`...)
		b = strconv.AppendInt(b, int64(*in.SMPct), 10)
	}
	if len(in.Servers) > 0 {
		b = append(b, `,"servers":[`...)
		for i, s := range in.Servers {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"pid":`...)
			b = strconv.AppendInt(b, int64(s.PID), 10)
			if s.UID != nil {
				b = append(b, `,"uid":`...)
				b = strconv.AppendUint(b, uint64(*s.UID), 10)
			}
			b = append(b, `,"clients":`...)
			b = strconv.AppendInt(b, int64(s.Clients), 10)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if len(in.SlurmJobs) > 0 {
		b = append(b, `,"slurm_jobs":[`...)
		for i, j := range in.SlurmJobs {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendUint(b, j, 10)
		}
		b = append(b, ']')
	}
	b = jsonenc.OptionalString(b, `,"error":`, in.Error)
	return append(b, '}')
}

// Each instance owns a contiguous range of its GPU's units, the same ranges
// on every GPU of the node and in every snapshot, and on a large node these
// lists are most of a snapshot's bytes. So the encoding of a range is kept
// and copied: telling a range takes a comparison a unit, writing its digits
// anew about twenty times that. Only ranges of at least minCachedRange units
// are kept, and at most maxCachedRanges of them (the cache starts again when
// full), so that nothing grows with what callers pass.
const (
	minCachedRange  = 16
	maxCachedRanges = 64
)

var rangeCache struct {
	mu sync.Mutex
	m  map[[2]int][]byte // first unit and count → encoding
}

// appendUnits appends a list of unit indices as encoding/json encodes it.
func appendUnits(b []byte, units []int) []byte {
	if len(units) < minCachedRange || !contiguous(units) {
		return jsonenc.Ints(b, units)
	}
	key := [2]int{units[0], len(units)}
	rangeCache.mu.Lock()
	defer rangeCache.mu.Unlock()
	enc, ok := rangeCache.m[key]
	if !ok {
		if len(rangeCache.m) >= maxCachedRanges || rangeCache.m == nil {
			rangeCache.m = make(map[[2]int][]byte, maxCachedRanges)
		}
		enc = jsonenc.Ints(nil, units)
		rangeCache.m[key] = enc
	}
	return append(b, enc...)
}

// contiguous reports whether units counts up by one from its first.
func contiguous(units []int) bool {
	for i, u := range units {
		if u != units[0]+i {
			return false
		}
	}
	return true
}

// appendMarshaled appends key and v as encoding/json encodes it.
func appendMarshaled(b []byte, key string, v any) ([]byte, error) {
	j, err := json.Marshal(v)
	if err != nil {
		return b, err
	}
	return append(append(b, key...), j...), nil
}
