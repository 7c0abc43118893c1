package inventory

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
)

// xidOf is the Xid a sample was failed with, 0 if none.
func xidOf(t *testing.T, s Sample) uint64 {
	t.Helper()
	var xe *XidError
	if s.Xid != 0 && (!errors.As(s.Err, &xe) || xe.Xid != s.Xid) {
		t.Fatalf("sample %+v has Xid %d but its error is not that Xid's", s, s.Xid)
	}
	return s.Xid
}

func TestNVMLCriticalXidFailsItsGPUUntilCleared(t *testing.T) {
	s, x := newMockServer(t)
	b, logs := openNVML(t, s)
	faults := make(chan struct{}, 8)
	b.OnFault(func() { faults <- struct{}{} })
	x.mu.Lock()
	if len(x.registered) != 8 {
		t.Errorf("GPUs registered for Xid events: %v, want all 8", x.registered)
	}
	x.mu.Unlock()
	x.xid(s.Devices[2], 79)
	select {
	case <-faults:
	case <-time.After(10 * time.Second):
		t.Fatal("OnFault not called for a critical Xid")
	}
	if b.Sample(2, Load{}).Xid != 79 {
		t.Fatal("OnFault called before the fault was recorded")
	}
	got := b.Sample(2, Load{})
	if xidOf(t, got) != 79 || got.Err.Error() != "Xid 79: GPU has fallen off the bus" {
		t.Fatalf("GPU 2 sample %+v, want failed with Xid 79 and its meaning", got)
	}
	// Its readings still show: the failure is the Xid, not an NVML error.
	if got.KernelTimePct != 20 {
		t.Errorf("GPU 2 kernel time %d, want the reading 20", got.KernelTimePct)
	}
	for _, i := range []int{0, 1, 3, 7} {
		if got := b.Sample(i, Load{}); got.Err != nil || got.Xid != 0 {
			t.Errorf("GPU %d failed too: %+v", i, got)
		}
	}
	// The line follows the latch; wait for it.
	testutil.Eventually(t, "the event's log line", func() bool { return len(logs.lines("xid=79")) > 0 })
	lines := logs.lines("xid=79")
	if len(lines) != 1 || !strings.Contains(lines[0], "level=ERROR") || !strings.Contains(lines[0], "gpu=2 ") ||
		!strings.Contains(lines[0], s.Devices[2].(*server.Device).UUID) || !strings.Contains(lines[0], "fallen off the bus") {
		t.Fatalf("log lines of the event: %q, want one error line naming GPU 2, its UUID and the Xid's meaning", lines)
	}
	// Waits that time out with no event do not clear it; a second fault
	// keeps the first Xid.
	since := x.waits.Load()
	testutil.Eventually(t, "two waits with no event", func() bool { return x.waits.Load() >= since+3 })
	x.xid(s.Devices[2], 48)
	testutil.Eventually(t, "the second event logged", func() bool { return len(logs.lines("xid=48")) == 1 })
	if got := xidOf(t, b.Sample(2, Load{})); got != 79 {
		t.Fatalf("GPU 2 Xid %d after waits with no event and a second fault, want 79 still", got)
	}
	if cleared := b.ClearXid(2); cleared != 79 {
		t.Fatalf("ClearXid(2) = %d, want 79", cleared)
	}
	if got := b.Sample(2, Load{}); got.Err != nil || got.Xid != 0 {
		t.Fatalf("GPU 2 after clearing: %+v", got)
	}
	if cleared := b.ClearXid(2); cleared != 0 {
		t.Fatalf("ClearXid of a GPU without fault = %d", cleared)
	}
	// A new fault after clearing fails it again.
	x.xid(s.Devices[2], 74)
	testutil.Eventually(t, "GPU 2 failed with Xid 74", func() bool { return b.Sample(2, Load{}).Xid == 74 })
}

func TestNVMLApplicationXidAndOtherEventsIgnored(t *testing.T) {
	s, x := newMockServer(t)
	b, logs := openNVML(t, s)
	var faults atomic.Int32
	b.OnFault(func() { faults.Add(1) })
	for _, xid := range []uint64{13, 31, 43, 45, 68, 109} {
		x.xid(s.Devices[1], xid)
	}
	// Not an Xid event, though its data reads 79.
	x.send(nvml.EventData{Device: s.Devices[1], EventType: nvml.EventTypeSingleBitEccError, EventData: 79})
	// Events are handled in order: once GPU 3 fails, those before were seen.
	x.xid(s.Devices[3], 64)
	testutil.Eventually(t, "GPU 3 failed", func() bool { return b.Sample(3, Load{}).Xid == 64 })
	if got := b.Sample(1, Load{}); got.Err != nil || got.Xid != 0 {
		t.Fatalf("GPU 1 failed by application Xids or a non-Xid event: %+v", got)
	}
	testutil.Eventually(t, "the Xid 64 line", func() bool { return len(logs.lines("xid=64")) > 0 })
	if n := len(logs.lines("application error")); n != 6 {
		t.Errorf("%d application Xid lines, want 6 (one per event)", n)
	}
	if l := logs.lines("xid=13"); len(l) != 1 || !strings.Contains(l[0], "level=WARN") || !strings.Contains(l[0], "stays in service") {
		t.Errorf("Xid 13 line %q", l)
	}
	if l := logs.lines("xid=79"); len(l) != 0 {
		t.Errorf("the non-Xid event was logged as an Xid: %q", l)
	}
	if n := faults.Load(); n != 1 {
		t.Errorf("OnFault called %d times, want once (for Xid 64 only)", n)
	}
}

func TestNVMLXidOfUnreadableGPUFailsEveryGPU(t *testing.T) {
	s, x := newMockServer(t)
	b, logs := openNVML(t, s)
	lost := &mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }}
	x.xid(lost, 79)
	testutil.Eventually(t, "every GPU failed", func() bool {
		for i := range 8 {
			if b.Sample(i, Load{}).Xid != 79 {
				return false
			}
		}
		return true
	})
	testutil.Eventually(t, "the line", func() bool { return len(logs.lines("UUID does not read")) > 0 })
	if l := logs.lines("UUID does not read"); len(l) != 1 || !strings.Contains(l[0], `gpus="[0 1 2 3 4 5 6 7]"`) {
		t.Fatalf("log %q, want one line naming every GPU", l)
	}
	// An event without a device counts for every GPU as well.
	b.ClearXid(0)
	x.send(nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: 48})
	testutil.Eventually(t, "GPU 0 failed by a device-less event", func() bool { return b.Sample(0, Load{}).Xid == 48 })
}

func TestNVMLCloseStopsTheWatcher(t *testing.T) {
	s, x := newMockServer(t)
	b, _ := openNVML(t, s)
	testutil.Eventually(t, "the watcher waiting", func() bool { return x.waits.Load() >= 2 })
	start := time.Now()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %s, want about one wait (%dms)", d, testWaitMS)
	}
	select {
	case <-b.done:
	default:
		t.Fatal("Close returned with the watcher still running")
	}
	if n := x.frees.Load(); n != 1 {
		t.Fatalf("event set freed %d times, want once", n)
	}
	// The watcher, the one caller of Wait, has returned (done is closed):
	// no Wait can come after Close, and the set's Wait fails the test if one
	// did after the free.
	waits := x.waits.Load()
	if err := b.Close(); err != nil || x.frees.Load() != 1 || x.waits.Load() != waits {
		t.Fatalf("a second Close: %v, frees %d, waits %d then %d", err, x.frees.Load(), waits, x.waits.Load())
	}
}

func TestNVMLWaitFailureIsLoggedOnceAndDoesNotSpin(t *testing.T) {
	s, x := newMockServer(t)
	x.fail.Store(int32(nvml.ERROR_UNKNOWN))
	start := time.Now()
	b, logs := openNVML(t, s)
	// Between two failed waits the watcher pauses one wait period: the
	// sixth wait cannot start before five have passed.
	const tries = 6
	testutil.Eventually(t, "the failing waits tried again", func() bool { return x.waits.Load() >= tries })
	if d := time.Since(start); d < (tries-1)*testWaitMS*time.Millisecond {
		t.Errorf("%d failing waits in %s, under %d wait periods: the failing wait spins", tries, d, tries-1)
	}
	if l := logs.lines("waiting for Xid events failed"); len(l) != 1 {
		t.Errorf("failure lines %q, want one", l)
	}
	x.fail.Store(int32(nvml.SUCCESS))
	x.xid(s.Devices[0], 79)
	testutil.Eventually(t, "GPU 0 failed after the wait recovered", func() bool { return b.Sample(0, Load{}).Xid == 79 })
	testutil.Eventually(t, "the Xid line", func() bool { return len(logs.lines("xid=79")) > 0 })
	if l := logs.lines("works again"); len(l) != 1 {
		t.Errorf("recovery lines %q, want one", l)
	}
}

func TestNVMLWithoutXidEventsStillWorks(t *testing.T) {
	t.Run("event set not created", func(t *testing.T) {
		s, x := newMockServer(t)
		s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
		b, logs := openNVML(t, s)
		if got := b.Sample(0, Load{}); got.Err != nil {
			t.Fatalf("sample %+v", got)
		}
		if len(logs.lines("cannot watch Xid events")) != 1 {
			t.Error("no warning that Xid events are not watched")
		}
		if err := b.Close(); err != nil || x.frees.Load() != 0 {
			t.Fatalf("Close: %v, frees %d", err, x.frees.Load())
		}
	})
	t.Run("one GPU cannot register", func(t *testing.T) {
		s, x := newMockServer(t)
		s.Devices[4].(*server.Device).RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
		b, logs := openNVML(t, s)
		if l := logs.lines("cannot watch a GPU's Xid events"); len(l) != 1 || !strings.Contains(l[0], "gpu=4") {
			t.Errorf("warning lines %q, want one for GPU 4", l)
		}
		if got := b.Sample(4, Load{}); got.Err != nil {
			t.Fatalf("GPU 4 failed for lack of Xid events: %+v", got)
		}
		x.xid(s.Devices[6], 79)
		testutil.Eventually(t, "GPU 6 failed", func() bool { return b.Sample(6, Load{}).Xid == 79 })
	})
	t.Run("no GPU can register", func(t *testing.T) {
		s, x := newMockServer(t)
		for _, d := range s.Devices {
			d.(*server.Device).RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
		}
		b, _ := openNVML(t, s)
		if x.frees.Load() != 1 || b.events != nil {
			t.Fatalf("the unused event set was not freed (frees %d)", x.frees.Load())
		}
		if err := b.Close(); err != nil || x.frees.Load() != 1 {
			t.Fatalf("Close: %v, frees %d", err, x.frees.Load())
		}
	})
}

func TestSimXid(t *testing.T) {
	s := NewSim("n", []Model{Models[5], Models[5]})
	app, fault, zero := uint64(13), uint64(79), uint64(0)
	if err := s.Set(0, api.SimGPUUpdate{Xid: &app}); err != nil {
		t.Fatal(err)
	}
	if got := s.Sample(0, Load{UnitsTotal: 16}); got.Err != nil || got.Xid != 0 {
		t.Fatalf("application Xid failed the GPU: %+v", got)
	}
	if err := s.Set(0, api.SimGPUUpdate{Xid: &fault}); err != nil {
		t.Fatal(err)
	}
	got := s.Sample(0, Load{UnitsTotal: 16})
	if xidOf(t, got) != 79 || !strings.Contains(got.Err.Error(), "Xid 79") {
		t.Fatalf("after Xid 79: %+v", got)
	}
	if got := s.Sample(1, Load{UnitsTotal: 16}); got.Err != nil {
		t.Fatalf("GPU 1 failed too: %+v", got)
	}
	// Setting the state back to working does not clear an Xid: only ClearXid does.
	working := api.GPUWorking
	if err := s.Set(0, api.SimGPUUpdate{State: &working}); err != nil {
		t.Fatal(err)
	}
	if xidOf(t, s.Sample(0, Load{UnitsTotal: 16})) != 79 {
		t.Fatal("state working cleared the Xid")
	}
	if s.ClearXid(0) != 79 || s.ClearXid(0) != 0 {
		t.Fatal("ClearXid did not return the Xid once")
	}
	if got := s.Sample(0, Load{UnitsTotal: 16}); got.Err != nil {
		t.Fatalf("after clearing: %+v", got)
	}
	if err := s.Set(0, api.SimGPUUpdate{Xid: &zero}); err == nil {
		t.Fatal("Xid 0 accepted")
	}
}

func TestXidRule(t *testing.T) {
	for _, tc := range []struct {
		xid      uint64
		critical bool
		meaning  string
	}{
		{48, true, "double-bit ECC"}, {63, true, "row remapping"}, {64, true, "row remapping"},
		{74, true, "NVLink"}, {79, true, "fallen off the bus"}, {999, true, "Xid catalogue"},
		{13, false, "graphics engine"}, {31, false, "page fault"}, {43, false, "stopped"},
		{45, false, "preemptive"}, {68, false, "video"}, {109, false, "context switch"}, {0, false, ""},
	} {
		if XidCritical(tc.xid) != tc.critical || !strings.Contains(XidMeaning(tc.xid), tc.meaning) {
			t.Errorf("Xid %d: critical %v meaning %q; want %v and %q", tc.xid, XidCritical(tc.xid), XidMeaning(tc.xid), tc.critical, tc.meaning)
		}
	}
}

func TestResolve(t *testing.T) {
	devs := NewSim("n", []Model{Models[0], Models[0]}).Devices()
	for _, tc := range []struct {
		in   string
		want int
		err  string
	}{
		{"1", 1, ""}, {strings.ToLower(devs[1].UUID), 1, ""}, {devs[0].UUID, 0, ""},
		{"2", 0, "no GPU with index 2"}, {"-1", 0, "no GPU with index -1"}, {"GPU-nope", 0, "no GPU with UUID"},
	} {
		got, err := Resolve(devs, tc.in)
		if tc.err != "" {
			if !errors.Is(err, api.ErrBadRequest) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Resolve(%q) error %v, want bad_request %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Resolve(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}
