package journal

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"

	"golang.org/x/sys/unix"

	"github.com/gpulet/gpulet/internal/statefile"
)

// Writer is what a File appends through: the open file, or a test's
// stand-in that fails where the test wants (WrapWriter).
type Writer interface {
	io.Writer
	Truncate(size int64) error
	Close() error
}

// Reserver is a Writer that keeps room past the end of the file without
// changing its size. An *os.File does, through fallocate(FALLOC_FL_KEEP_SIZE)
// (tmpfs and the common disk file systems have it); a test's stand-in may.
type Reserver interface {
	Reserve(off, n int64) error
}

// File is the open log. Nothing is appended while it is failed: the file may
// then be behind the caller's table (an end that could not be recorded) or
// end in part of a record, and only a rewrite from the table puts it right.
//
// Releases are recorded even on a full run dir: past its end the file keeps
// room for an end record of every lease it holds (reserve), set aside before
// each grant or renewal is written. When that room cannot be had, the file is
// short (Failed says why): it takes no grant or renewal, but still takes end
// records, which land in the room kept for them.
type File struct {
	path string
	w    Writer
	// size is the file's length up to the end of its last whole record, where
	// a failed append is cut back to.
	size int64
	// records counts the records appended since the last rewrite.
	records int
	// failed says why records cannot be written; nil when they can.
	failed error
	// short says why grants and renewals cannot be written while end
	// records can (the room for them is kept); nil when they can.
	short error
	// live counts the leases the file holds: granted and not ended, for
	// the room their ends need.
	live int
	// kept is the offset up to which room is kept: nothing gives it back
	// but a truncate, which fails the file, or a rewrite, which starts anew.
	kept int64
	// buf is the last record's line, kept to build the next one in.
	buf []byte
	// cleaned is set once the first rewrite has looked for what a crashed
	// daemon's rewrite left.
	cleaned bool
}

// NewFile is the journal at path, not yet open: the first Rewrite writes it
// and opens it for appending.
func NewFile(path string) *File { return &File{path: path} }

// Failed says why records cannot be appended; nil when they can. While the
// file is short (see File) it says why, though end records are still taken.
func (j *File) Failed() error {
	if j.failed != nil {
		return j.failed
	}
	return j.short
}

// Records counts the records appended since the last rewrite.
func (j *File) Records() int { return j.records }

// WrapWriter puts wrap(w) in the place of the writer w that records are
// appended through: how tests make the disk fill up under an open journal.
func (j *File) WrapWriter(wrap func(Writer) Writer) { j.w = wrap(j.w) }

// Rewrite replaces the journal with one holding just entries, and opens it for
// appending. When the new file cannot be written the old one stays in place,
// whole: a journal that was working goes on appending to it (and its caller
// tries again later), one that was failed or never opened is failed.
func (j *File) Rewrite(entries []Entry) error {
	if err := j.rewrite(entries); err != nil {
		if j.w == nil || j.failed != nil {
			j.failed = err
		}
		j.records = 0
		return err
	}
	return nil
}

func (j *File) rewrite(entries []Entry) error {
	if !j.cleaned {
		// A daemon killed in a rewrite left its temporary file, which holds
		// room in the run dir until a reboot: this daemon, the journal's only
		// writer now, removes it before it needs that room.
		statefile.RemoveTemps(j.path)
		j.cleaned = true
	}
	// Records are appended to one buffer, sized for a lease record of a
	// few hundred bytes each: no copies as it grows.
	buf, err := AppendRecord(make([]byte, 0, 512*(len(entries)+1)), Record{Op: OpSchema, Schema: Schema})
	if err != nil {
		return err
	}
	for i := range entries {
		if buf, err = AppendRecord(buf, Record{Op: OpLease, Entry: &entries[i]}); err != nil {
			return err
		}
	}
	if err := statefile.Replace(j.path, buf, 0o600); err != nil {
		return fmt.Errorf("writing %s anew: %w", j.path, err)
	}
	f, err := os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		// The old descriptor names the file just replaced: appending there
		// would record nothing.
		j.Close()
		return fmt.Errorf("opening %s: %w", j.path, err)
	}
	j.Close()
	j.w, j.size, j.records, j.failed, j.short, j.live, j.kept = f, int64(len(buf)), 0, nil, nil, len(entries), 0
	if err := j.reserve(0); err != nil {
		j.short = fmt.Errorf("%s written anew, but %w", j.path, err)
		return j.short
	}
	return nil
}

// endRoom is the most bytes one end record takes.
var endRoom = func() int64 {
	id := IDPrefix
	for range IDHexLen {
		id += "f"
	}
	b, _ := AppendRecord(nil, Record{Op: OpEnd, ID: id, PeakMemoryMiB: math.MaxUint64})
	return int64(len(b))
}()

// reserveSlack is room kept beyond the ends' own: a page, what tmpfs
// allocates at a time. reserveAhead is kept beyond that where it can be, so
// that most records find their room kept already and cost no system call.
const (
	reserveSlack = 4096
	reserveAhead = 4 << 10
)

// reserve keeps room past the end of the file for next bytes and an end
// record of every lease the file will then hold (j.live). A file system
// without fallocate keeps none, as before there was any.
func (j *File) reserve(next int64) error {
	need := j.size + next + int64(j.live)*endRoom + reserveSlack
	if need <= j.kept {
		return nil
	}
	err := j.allocate(need + reserveAhead)
	if err != nil {
		err = j.allocate(need)
	}
	if err != nil {
		return fmt.Errorf("the room to record the release of each of its %d leases cannot be kept (%w): releases are recorded, grants and renewals not", j.live, err)
	}
	return nil
}

// allocate keeps room up to the offset end.
func (j *File) allocate(end int64) error {
	var err error
	switch w := j.w.(type) {
	case Reserver:
		err = w.Reserve(j.size, end-j.size)
	case interface{ Fd() uintptr }:
		err = unix.Fallocate(int(w.Fd()), unix.FALLOC_FL_KEEP_SIZE, j.size, end-j.size)
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
			// Nothing to keep room with: every record tries its luck.
			return nil
		}
	default:
		return nil
	}
	if err == nil {
		j.kept = end
	}
	return err
}

// Append writes one record with one write(2). When the write fails, what it
// wrote of the record is cut off again before anything else can follow it, and
// the journal is failed until a rewrite.
func (j *File) Append(r Record) error {
	if j.failed != nil {
		return j.failed
	}
	if j.w == nil {
		return errors.New("journal is not open")
	}
	b, err := AppendRecord(j.buf[:0], r)
	if err != nil {
		return err
	}
	if cap(b) <= maxKeptRecord {
		// A rare large record (labels) is not kept for ever.
		j.buf = b
	}
	// An end needs no room of its own: it was kept when its lease was
	// granted. Anything else first keeps room for what follows it.
	ends := j.live
	if r.Op == OpLease {
		ends++
	}
	if r.Op != OpEnd {
		if j.short != nil {
			return j.short
		}
		live := j.live
		j.live = ends
		err := j.reserve(int64(len(b)))
		j.live = live
		if err != nil {
			j.short = err
			return err
		}
	}
	n, err := j.w.Write(b)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	if err != nil {
		j.failed = err
		if n > 0 {
			if terr := j.w.Truncate(j.size); terr != nil {
				j.failed = fmt.Errorf("%w; and cutting off the part of a record it left failed too: %v", err, terr)
			}
		}
		return j.failed
	}
	j.size += int64(n)
	j.records++
	switch {
	case r.Op == OpLease:
		j.live++
	case r.Op == OpEnd && j.live > 0:
		j.live--
	}
	return nil
}

// Close closes the open file, if any; a later Rewrite opens it again.
func (j *File) Close() error {
	if j.w == nil {
		return nil
	}
	err := j.w.Close()
	j.w = nil
	return err
}
