package bench

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The contract floor is floor-proc plus what docs/design.md asks of any daemon for a
// lease and its release, done the cheapest way this machine allows:
//
//   - a lease's unit gets a FIFO (mknodat) at a unit name, and a release
//     removes it (unlinkat): the count of FIFOs is the units in use (§5);
//   - that folder is under an inotify watch, read in batches after 1 ms
//     rests, since offline claims must be counted within milliseconds (§5);
//   - each grant and each release appends one journal record with one
//     write(2) before the answer, since leases survive a daemon's restart
//     (§6); the journal is cut back now and then, as gpuletd rewrites its.
//
// Nothing else: no placement, no table, no checks. What gpuletd costs beyond
// this floor is its own; what this floor costs beyond floor-proc is the
// contract's, paid by any daemon that keeps it.
const floorLedgerEnv = "GPULET_BENCH_FLOOR_LEDGER"

// floorJournalEnv names the contract floor's journal file.
const floorJournalEnv = "GPULET_BENCH_FLOOR_JOURNAL"

// contractFloor serves floorHandler's answers after doing the contract's
// syscalls for them.
type contractFloor struct {
	plain http.Handler
	// folder is the watched folder the unit FIFOs go in.
	folder int
	next   atomic.Uint64

	mu          sync.Mutex
	journal     *os.File
	records     int
	leaseRecord []byte
	endRecord   []byte
}

// floorConnKey holds, in a connection's context, the unit its last lease made:
// each benchmark client leases and releases in turn on one connection.
type floorConnKey struct{}

// journalCutEvery is how many records the contract floor appends before it
// empties its journal, about as often as gpuletd writes its own anew.
const journalCutEvery = 2048

func newContractFloor(dir, journalPath string, body, leaseBody []byte) (*contractFloor, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	folder, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if _, err := unix.InotifyAddWatch(in, dir, unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_DELETE|unix.IN_MOVED_FROM); err != nil {
		return nil, err
	}
	go func() {
		buf := make([]byte, 64<<10)
		for {
			time.Sleep(time.Millisecond)
			for {
				if _, err := unix.Read(in, buf); err != nil {
					break
				}
			}
		}
	}()
	journal, err := os.OpenFile(journalPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	return &contractFloor{
		plain: floorHandler(body, leaseBody), folder: folder, journal: journal,
		leaseRecord: append(bytes.TrimRight(bytes.Clone(leaseBody), "\n"), '\n'),
		endRecord:   []byte(`{"op":"end","id":"l-0123456789abcdef"}` + "\n"),
	}, nil
}

func (f *contractFloor) connContext(ctx context.Context, _ net.Conn) context.Context {
	return context.WithValue(ctx, floorConnKey{}, new(string))
}

func (f *contractFloor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	unit := r.Context().Value(floorConnKey{}).(*string)
	switch r.Method {
	case http.MethodPost:
		*unit = "unit-" + strconv.FormatUint(f.next.Add(1), 10)
		if err := unix.Mknodat(f.folder, *unit, unix.S_IFIFO|0o600, 0); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		f.record(f.leaseRecord)
	case http.MethodDelete:
		if err := unix.Unlinkat(f.folder, *unit, 0); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		f.record(f.endRecord)
	}
	f.plain.ServeHTTP(w, r)
}

// record appends one journal record, one write.
func (f *contractFloor) record(b []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.records++; f.records >= journalCutEvery {
		f.journal.Truncate(0)
		f.records = 0
	}
	f.journal.Write(b)
}

// serveContractFloor serves the contract floor on ln until the process is
// killed.
func serveContractFloor(ln net.Listener, dir, journalPath string, body, leaseBody []byte) error {
	f, err := newContractFloor(dir, journalPath, body, leaseBody)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: f, ConnContext: f.connContext}
	return srv.Serve(ln)
}

// contractFloorProcess starts the contract floor in its own process, its
// folder on tmpfs as gpuletd's run dir is and its journal in the test's
// temporary folder as gpuletd's state dir is (e2e.StartBinary), and returns
// its socket, that folder and the journal's path.
func contractFloorProcess(tb testing.TB, body, leaseBody []byte) (sock, dir, journal string) {
	tb.Helper()
	dir = filepath.Join(tmpfsDir(tb), "ledger")
	journal = filepath.Join(tb.TempDir(), "journal")
	return startFloorProcess(tb, body, leaseBody, floorLedgerEnv+"="+dir, floorJournalEnv+"="+journal), dir, journal
}
