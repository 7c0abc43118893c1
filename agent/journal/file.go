package journal

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/gpulet/gpulet/internal/statefile"
)

// Writer is what a File appends through: the open file, or a test's
// stand-in that fails where the test wants (WrapWriter).
type Writer interface {
	io.Writer
	Truncate(size int64) error
	Close() error
}

// File is the open log. Nothing is appended while it is failed: the file may
// then be behind the caller's table (an end that could not be recorded) or
// end in part of a record, and only a rewrite from the table puts it right.
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
	// buf is the last record's line, kept to build the next one in.
	buf []byte
	// cleaned is set once the first rewrite has looked for what a crashed
	// daemon's rewrite left.
	cleaned bool
}

// NewFile is the journal at path, not yet open: the first Rewrite writes it
// and opens it for appending.
func NewFile(path string) *File { return &File{path: path} }

// Failed says why records cannot be appended; nil when they can.
func (j *File) Failed() error { return j.failed }

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
	j.w, j.size, j.records, j.failed = f, int64(len(buf)), 0, nil
	return nil
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
