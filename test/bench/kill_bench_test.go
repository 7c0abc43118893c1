package bench

import (
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/api"
)

// sleeper starts `sleep 60`, the process a lease will be bound to.
func sleeper(b *testing.B) *exec.Cmd {
	b.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return cmd
}

// BenchmarkKillHolder is the time from kill -9 of a process holding a lease
// (one unit, bound to its pid) to the first GET /v1/snapshot that shows the
// unit free again. The floor is the same kill seen by a pidfd polled in this
// process, the mechanism gpuletd uses: what the kernel alone costs. The
// sleeper is reaped only after the measurement, as a parent that is busy
// elsewhere would. Goal: gpuletd's p99 ≤ 50ms.
func BenchmarkKillHolder(b *testing.B) {
	d := startDaemon(b)
	c := httpClient(d.Socket)
	defer c.CloseIdleConnections()
	s, err := snapshot(c)
	if err != nil {
		b.Fatal(err)
	}
	total := s.UnitsTotal

	b.Run("floor", func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		for range b.N {
			b.StopTimer()
			cmd := sleeper(b)
			pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			t0 := time.Now()
			if err := unix.Kill(cmd.Process.Pid, unix.SIGKILL); err != nil {
				b.Fatal(err)
			}
			pfd := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
			for {
				n, err := unix.Poll(pfd, 10_000)
				if err == unix.EINTR {
					continue
				}
				if err != nil || n != 1 {
					b.Fatalf("poll on the pidfd: %d, %v", n, err)
				}
				break
			}
			lat = append(lat, time.Since(t0))
			b.StopTimer()
			unix.Close(pidfd)
			cmd.Wait()
			b.StartTimer()
		}
		b.StopTimer()
		reportLatencies(b, "", lat)
	})

	b.Run("gpuletd", func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		for range b.N {
			b.StopTimer()
			cmd := sleeper(b)
			resp, err := c.Post("http://gpulet/v1/leases", "application/json", strings.NewReader(fmt.Sprintf(`{"units":1,"pid":%d}`, cmd.Process.Pid)))
			if err != nil {
				b.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				b.Fatalf("lease bound to pid %d: HTTP %d: %s", cmd.Process.Pid, resp.StatusCode, body)
			}
			// The lease is in the snapshot when the answer comes.
			pollUntil(b, c, 10*time.Second, "the lease counted", func(s *api.Snapshot) bool { return s.UnitsFree == total-1 })
			b.StartTimer()
			t0 := time.Now()
			if err := unix.Kill(cmd.Process.Pid, unix.SIGKILL); err != nil {
				b.Fatal(err)
			}
			t := pollUntil(b, c, 10*time.Second, "the killed holder's unit free", func(s *api.Snapshot) bool { return s.UnitsFree == total })
			lat = append(lat, t.Sub(t0))
			b.StopTimer()
			cmd.Wait()
			b.StartTimer()
		}
		b.StopTimer()
		reportLatencies(b, "", lat)
	})
}
