package test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/internal/testutil"
	"github.com/gpulet/gpulet/test/e2e"
)

// request runs one API request as u and returns what it printed.
func request(t *testing.T, d *e2e.Daemon, u testUser, method, path, body string) string {
	t.Helper()
	cmd := u.role(t, d, "request", "GPULET_E2E_METHOD="+method, "GPULET_E2E_PATH="+path, "GPULET_E2E_BODY="+body)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("request as %s: %v\n%s", u.name, err, out)
	}
	return strings.TrimSpace(string(out))
}

// startRole starts a helper role as u with pipes for its input and output,
// and reads its first line. The role ends when the test does.
func startRole(t *testing.T, d *e2e.Daemon, u testUser, role string, env ...string) (stdin io.WriteCloser, out *bufio.Reader, first string) {
	t.Helper()
	cmd := u.role(t, d, role, env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	pr, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	out = bufio.NewReader(pr)
	return stdin, out, readLine(t, out)
}

// TestAdminRightsComeFromTheCallersGroups: a member of --admin-group by a
// supplementary group (read from the connection, SO_PEERGROUPS) acts as an
// admin; a user outside it does not.
func TestAdminRightsComeFromTheCallersGroups(t *testing.T) {
	needUserTools(t)
	sock, admins := addGroup(t), addGroup(t)
	admin, plain := addUser(t, sock, admins), addUser(t, sock)
	d := startForUsers(t, sock, "--admin-group", admins)
	if got := request(t, d, plain, "POST", "/v1/node/drain", ""); !strings.HasPrefix(got, "403 forbidden") {
		t.Fatalf("drain by a user outside the admin group: %s", got)
	}
	if got := request(t, d, admin, "POST", "/v1/node/drain", ""); got != "200" {
		t.Fatalf("drain by a member of the admin group: %s", got)
	}
	if got := request(t, d, admin, "POST", "/v1/node/undrain", ""); got != "200" {
		t.Fatalf("undrain by a member of the admin group: %s", got)
	}
}

// TestRightsStayWithTheProcessThatConnected: a user outside the admin group
// connects, hands the connection to a child and exits; an admin's process
// then gets its pid. Requests on the connection still carry the rights of
// the process that connected, not of whatever has its pid: no drain, and no
// lease bound to the admin's process. The daemon is stopped meanwhile, so
// that it accepts the connection only after the pid changed hands (rights
// once came from /proc/<pid> at accept).
func TestRightsStayWithTheProcessThatConnected(t *testing.T) {
	needUserTools(t)
	sock, admins := addGroup(t), addGroup(t)
	admin, plain := addUser(t, sock, admins), addUser(t, sock)
	d := startForUsers(t, sock, "--admin-group", admins)

	if err := syscall.Kill(d.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resume := sync.OnceFunc(func() { syscall.Kill(d.Pid(), syscall.SIGCONT) })
	t.Cleanup(resume)

	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The holder runs on until it has answered or its input closes;
		// its user can be removed only once it has exited, which closes
		// the output.
		inW.Close()
		outR.SetReadDeadline(time.Now().Add(10 * time.Second))
		io.Copy(io.Discard, outR)
		outR.Close()
	})
	connector := plain.role(t, d, "connector")
	connector.Stdin, connector.Stdout, connector.Stderr = inR, outW, outW
	if err := connector.Start(); err != nil {
		t.Fatal(err)
	}
	inR.Close()
	outW.Close()
	out := bufio.NewReader(outR)
	if got := readLine(t, out); got != "holding" {
		t.Fatalf("connector: %s", got)
	}
	if err := connector.Wait(); err != nil {
		t.Fatalf("connector: %v", err)
	}
	pid := connector.Process.Pid
	takePid(t, pid, admin)

	resume()
	fmt.Fprintln(inW, "go")
	lease, drain := readLine(t, out), readLine(t, out)
	if !strings.HasPrefix(drain, "drain=403 forbidden") {
		t.Errorf("drain on the connection of a user outside the admin group, its pid now an admin's: %s", drain)
	}
	want := fmt.Sprintf("lease=400 bad_request pid: process %d, which connected, is not running", pid)
	if lease != want {
		t.Errorf("lease bound to the process that connected, its pid now an admin's:\n got %s\nwant %s", lease, want)
	}
	snap, err := d.Client.Snapshot(e2e.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if snap.State == "draining" || snap.UnitsFree != snap.UnitsTotal {
		t.Fatalf("node state %q with %d of %d units free, want no drain and no lease", snap.State, snap.UnitsFree, snap.UnitsTotal)
	}
}

// takePid starts a process of u with pid pid, which must be free, by setting
// the pid the kernel gave last; it is killed when the test ends.
func takePid(t *testing.T, pid int, u testUser) {
	t.Helper()
	for range 200 {
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0); err != nil {
			t.Skipf("cannot choose the next pid (%v), so a reused pid cannot be staged", err)
		}
		cmd := u.command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if cmd.Process.Pid == pid {
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			return
		}
		// Another process forked in between: try again.
		cmd.Process.Kill()
		cmd.Wait()
	}
	t.Fatalf("pid %d could not be given to a process of %s", pid, u.name)
}

// TestPidAnswersTellNothingAboutOthers: to a user who is not an admin,
// another user's process, a thread of it and a pid that runs nothing answer
// alike; a pid beyond the kernel's ceiling is a bad request, not an internal
// error.
func TestPidAnswersTellNothingAboutOthers(t *testing.T) {
	needUserTools(t)
	sock := addGroup(t)
	other, plain := addUser(t, sock), addUser(t, sock)
	d := startForUsers(t, sock)

	cmd := other.role(t, d, "block")
	pr, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	readLine(t, bufio.NewReader(pr))
	thread := 0
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if tid, _ := strconv.Atoi(e.Name()); tid != cmd.Process.Pid {
			thread = tid
		}
	}
	if thread == 0 {
		t.Fatal("the other user's Go process has no second thread")
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	for name, pid := range map[string]int{"another user's process": cmd.Process.Pid, "a thread of it": thread, "no process": gone.Process.Pid} {
		got := request(t, d, plain, "POST", "/v1/leases", fmt.Sprintf(`{"units":1,"pid":%d}`, pid))
		want := fmt.Sprintf("400 bad_request pid: process %d is not running or is not yours (give a process id, not a thread id)", pid)
		if got != want {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
	}
	got := request(t, d, plain, "POST", "/v1/leases", `{"units":1,"pid":2147483648}`)
	if want := "400 bad_request pid: must be a process id from 1 to 4194303, got 2147483648"; got != want {
		t.Errorf("pid 2^31:\n got %s\nwant %s", got, want)
	}
}

// TestConnectionsPerUIDAreCapped: a user's connections beyond
// --max-conns-per-uid are closed at once while another user and root still
// lease; once the user's connections close, it may connect again.
func TestConnectionsPerUIDAreCapped(t *testing.T) {
	needUserTools(t)
	sock := addGroup(t)
	hog, other := addUser(t, sock), addUser(t, sock)
	d := startForUsers(t, sock, "--max-conns-per-uid", "4")
	stdin, _, got := startRole(t, d, hog, "hog", "GPULET_E2E_CONNS=10")
	if got != "open=4 closed=6" {
		t.Fatalf("10 connections with a cap of 4: %s", got)
	}
	if got := request(t, d, other, "POST", "/v1/leases", `{"units":1,"ttl":"1m"}`); got != "201" {
		t.Fatalf("another user's lease while the first holds its connections: %s", got)
	}
	if _, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"}); err != nil {
		t.Fatalf("root's lease: %v", err)
	}
	if got := request(t, d, hog, "POST", "/v1/leases", `{"units":1,"ttl":"1m"}`); !strings.HasPrefix(got, "error") {
		t.Fatalf("a fifth connection of the capped user was served: %s", got)
	}
	if !strings.Contains(d.Log.String(), "connection refused: the user has as many open connections as one user may") {
		t.Fatalf("refusals not logged:\n%s", d.Log.String())
	}
	stdin.Close()
	testutil.Eventually(t, "the user to connect again once its connections closed", func() bool {
		return request(t, d, hog, "POST", "/v1/leases", `{"units":1,"ttl":"1m"}`) == "201"
	})
}

// TestWaitersPerUIDAreCapped: a user's requests waiting for units stop at
// --max-waiters-per-uid with too_many_requests; another user still queues.
func TestWaitersPerUIDAreCapped(t *testing.T) {
	needUserTools(t)
	sock := addGroup(t)
	waiter, other := addUser(t, sock), addUser(t, sock)
	d := startForUsers(t, sock, "--max-waiters-per-uid", "2", "--sim-gpus", "1xT4-16GB", "--clients-per-instance", "1")
	if _, err := d.Client.Lease(e2e.Ctx(t), api.LeaseRequest{Units: 1, TTL: "1m"}); err != nil {
		t.Fatal(err)
	}
	stdin, out, sent := startRole(t, d, waiter, "waiters", "GPULET_E2E_WAITERS=2")
	pid, err := strconv.Atoi(strings.TrimPrefix(sent, "sent "))
	if err != nil {
		t.Fatalf("the role said %q, want sent and its pid", sent)
	}
	// The requests are bound to the role's process: gpuletd opens a pidfd
	// on it for each just before it queues it.
	testutil.Eventually(t, "gpuletd to take both waiters in", func() bool { return pidfdsOn(t, d.Pid(), pid) == 2 })
	if _, err := io.WriteString(stdin, "one more\n"); err != nil {
		t.Fatal(err)
	}
	got := readLine(t, out)
	want := fmt.Sprintf("one more=429 too_many_requests wait: uid %d already has 2 requests waiting for units, the most one user may (--max-waiters-per-uid); retry when one has ended", waiter.uid)
	if got != want {
		t.Fatalf("a third waiter:\n got %s\nwant %s", got, want)
	}
	if got := request(t, d, other, "POST", "/v1/leases", `{"units":1,"ttl":"1m","wait":"300ms"}`); !strings.HasPrefix(got, "409 insufficient_units") || !strings.Contains(got, "after waiting 300ms") {
		t.Fatalf("another user's waiter: %s", got)
	}
}

// TestDescriptorsUnderALowLimit: with gpuletd's limit on open files cut to
// 64, one user's idle connections used to lock everyone out. Now that user
// keeps --max-conns-per-uid of them, another user still leases, and even
// root's connections stop at the reserve the daemon keeps for itself.
func TestDescriptorsUnderALowLimit(t *testing.T) {
	needUserTools(t)
	sock := addGroup(t)
	hog, other := addUser(t, sock), addUser(t, sock)
	d := startForUsers(t, sock, "--max-conns-per-uid", "8")
	if err := unix.Prlimit(d.Pid(), unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 64, Max: 64}, nil); err != nil {
		t.Fatal(err)
	}
	stdin, _, got := startRole(t, d, hog, "hog", "GPULET_E2E_CONNS=50")
	if got != "open=8 closed=42" {
		t.Fatalf("50 connections with a cap of 8: %s", got)
	}
	if got := request(t, d, other, "POST", "/v1/leases", `{"units":1,"ttl":"1m"}`); got != "201" {
		t.Fatalf("another user's lease while the first holds its connections: %s", got)
	}
	stdin.Close()

	// Root is not capped per uid, but the reserve (a quarter of 64) holds.
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for range 80 {
		c, err := net.Dial("unix", d.Socket)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// Read all at once: a kept connection is closed by the server's own
	// timeout for a request's header after 5 seconds.
	var closed atomic.Int64
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			if _, err := c.Read(make([]byte, 1)); err == io.EOF {
				closed.Add(1)
			}
		})
	}
	wg.Wait()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("root: %d of %d connections closed at once; gpuletd holds %d descriptors", closed.Load(), len(conns), len(fds))
	if n := int(closed.Load()); n == 0 || n == len(conns) || len(fds) > 64-16 {
		t.Fatalf("%d of %d connections closed, gpuletd holds %d descriptors; want some kept, the rest closed, and at least 16 of 64 free", n, len(conns), len(fds))
	}
	for _, c := range conns {
		c.Close()
	}
	testutil.Eventually(t, "a lease once root's connections closed", func() bool {
		return request(t, d, other, "POST", "/v1/leases", `{"units":1,"ttl":"1m"}`) == "201"
	})
	if log := d.Log.String(); !strings.Contains(log, "open file descriptors are near the limit") || strings.Contains(log, "too many open files") {
		t.Fatalf("want refusals at the reserve and no descriptor exhaustion in the log:\n%s", log)
	}
}
