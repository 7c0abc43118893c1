package offline

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/agent/ledger"
)

func testLayout(t *testing.T) (string, *ledger.Layout) {
	t.Helper()
	dir := t.TempDir()
	lay := &ledger.Layout{Schema: ledger.LayoutSchema, GPUs: []ledger.LayoutGPU{
		{Index: 0, UUID: "GPU-a", Name: "NVIDIA A100-SXM4-80GB", UnitsTotal: 4, Instances: []ledger.LayoutInstance{
			{Instance: 0, Units: []int{0, 1}, Env: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-a", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M"}},
			{Instance: 1, Units: []int{2, 3}, Env: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-a"}},
		}},
		{Index: 1, UUID: "GPU-b", Name: "Tesla T4", UnitsTotal: 2, Instances: []ledger.LayoutInstance{
			{Instance: 0, Units: []int{0, 1}, Env: map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-b"}},
		}},
	}}
	for _, g := range lay.GPUs {
		for _, in := range g.Instances {
			os.MkdirAll(filepath.Join(dir, "units", g.UUID, strconv.Itoa(in.Instance)), 0o755)
		}
	}
	b, _ := json.Marshal(lay)
	os.WriteFile(filepath.Join(dir, "units", ledger.LayoutFile), b, 0o644)
	return dir, lay
}

func TestTakeClaimsLockedFIFOs(t *testing.T) {
	dir, _ := testLayout(t)
	lay, err := ReadLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Take(dir, lay, Request{Units: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release(dir)
	if c.GPU.UUID != "GPU-a" || c.Instance != 0 || len(c.FDs) != 2 {
		t.Fatalf("claim %+v", c)
	}
	if c.Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "50" || c.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=40960M" || c.Env["CUDA_VISIBLE_DEVICES"] != "GPU-a" {
		t.Fatalf("env %v", c.Env)
	}
	for _, u := range c.Units {
		p := filepath.Join(dir, "units", "GPU-a", "0", ledger.UnitName(u))
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			t.Fatalf("%s is not a FIFO: %v", p, err)
		}
		// Another open of the FIFO cannot take the lock: the claim is held.
		fd, err := unix.Open(p, unix.O_RDWR|unix.O_NONBLOCK, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
			t.Fatalf("claim on unit %d not locked: %v", u, err)
		}
		unix.Close(fd)
		// The descriptor survives exec.
		flags, _ := unix.FcntlInt(uintptr(c.FDs[0]), unix.F_GETFD, 0)
		if flags&unix.FD_CLOEXEC != 0 {
			t.Fatal("claim descriptor is close-on-exec")
		}
	}
	// Instance 0 is full: the next claim of 2 goes to instance 1; then GPU 1.
	c2, err := Take(dir, lay, Request{Units: 2})
	if err != nil || c2.Instance != 1 {
		t.Fatalf("second claim %+v %v", c2, err)
	}
	c3, err := Take(dir, lay, Request{Units: 1, Type: "t4"})
	if err != nil || c3.GPU.Index != 1 {
		t.Fatalf("claim by type %+v %v", c3, err)
	}
	if _, err := Take(dir, lay, Request{Units: 2, GPU: "1"}); !errors.Is(err, ErrNoUnits) {
		t.Fatalf("claim on a full GPU: %v", err)
	}
	if _, err := Take(dir, lay, Request{Units: 1, GPU: "7"}); err == nil {
		t.Fatal("claim on a missing GPU")
	}
	// No temporary names are left behind.
	ents, _ := os.ReadDir(filepath.Join(dir, "units", "GPU-a", "0"))
	for _, e := range ents {
		if e.Name()[0] == '.' {
			t.Fatalf("temporary claim name left: %s", e.Name())
		}
	}
}

func TestReadLayoutErrors(t *testing.T) {
	if _, err := ReadLayout(t.TempDir()); err == nil {
		t.Fatal("no layout accepted")
	}
}

func FuzzDecodeLayout(f *testing.F) {
	good, _ := json.Marshal(ledger.Layout{Schema: ledger.LayoutSchema, GPUs: []ledger.LayoutGPU{{UUID: "GPU-a", UnitsTotal: 2, Instances: []ledger.LayoutInstance{{Units: []int{0, 1}}}}}})
	for _, s := range []string{string(good), `{}`, `{"schema":"gpulet.layout/v1","gpus":[{"uuid":"../x","units_total":1}]}`, `x`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b string) {
		lay, err := DecodeLayout([]byte(b))
		if err != nil {
			return
		}
		for _, g := range lay.GPUs {
			if g.UUID == "" || filepath.Base(g.UUID) != g.UUID || g.UUID == ".." || g.UUID == "." {
				t.Fatalf("accepted UUID %q", g.UUID)
			}
			for _, in := range g.Instances {
				for _, u := range in.Units {
					if u < 0 || u >= g.UnitsTotal {
						t.Fatalf("accepted unit %d of %d", u, g.UnitsTotal)
					}
				}
			}
		}
	})
}
