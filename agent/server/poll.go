package server

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/snapshot"
)

// maxPollWait bounds a long poll's wait (docs/design.md §8).
const maxPollWait = 60 * time.Second

// pollPoint is the snapshot a poller has: its seq, and the boot_id of the
// daemon run that made it when the poller gave one.
type pollPoint struct {
	boot string
	seq  uint64
}

// parsePoll reads a long poll's after=SEQ (or after=BOOT_ID-SEQ, the ETag's
// value without quotes) and wait=DURATION.
func parsePoll(q url.Values) (pollPoint, time.Duration, error) {
	var after pollPoint
	a := q.Get("after")
	if a == "" {
		return after, 0, api.Errorf(api.ErrBadRequest, "after: give the seq of the snapshot you have (or its ETag's value), to wait for a newer one")
	}
	seq := a
	if i := strings.LastIndexByte(a, '-'); i >= 0 {
		after.boot, seq = a[:i], a[i+1:]
	}
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil || strings.HasPrefix(a, "-") {
		return after, 0, api.Errorf(api.ErrBadRequest, "after: %q is not a seq (a whole number) nor an ETag value BOOT_ID-SEQ", a)
	}
	after.seq = n
	var wait time.Duration
	if w := q.Get("wait"); w != "" {
		if wait, err = time.ParseDuration(w); err != nil || wait < 0 || wait > maxPollWait {
			return after, 0, api.Errorf(api.ErrBadRequest, "wait: %q is not a duration from 0s to %s, such as 30s", w, maxPollWait)
		}
	}
	return after, wait, nil
}

// newer returns, as soon as there is one, a snapshot newer than after: one
// with a higher seq, or one of another daemon run than the poller names. It
// returns the current snapshot once wait has passed or the caller is gone.
func (s *Server) newer(ctx context.Context, p *snapshot.Published, after pollPoint, wait time.Duration) *snapshot.Published {
	if isNewer(p, after) || wait == 0 {
		return p
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		// The channel first, then the snapshot: a change between the two is
		// in the snapshot or closes the channel.
		changed := s.snaps.Changed()
		if p = s.snaps.Load(); isNewer(p, after) {
			return p
		}
		select {
		case <-changed:
		case <-timer.C:
			return s.snaps.Load()
		case <-ctx.Done():
			return p
		}
	}
}

func isNewer(p *snapshot.Published, after pollPoint) bool {
	if after.boot == "" {
		// ?after=SEQ alone: the caller did not say which daemon run.
		return p.Snapshot.Seq > after.seq
	}
	return api.SnapshotNewer(p.Snapshot.BootID, p.Snapshot.Seq, after.boot, after.seq)
}

// etag is a snapshot's ETag: its daemon run and seq, which name it.
func etag(s *api.Snapshot) string { return fmt.Sprintf(`"%s-%d"`, s.BootID, s.Seq) }

// noneMatch reports whether an If-None-Match header names tag (weak tags
// compare as strong: a snapshot's bytes follow from its tag).
func noneMatch(header, tag string) bool {
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimPrefix(strings.TrimSpace(t), "W/")
		if t == tag || t == "*" {
			return true
		}
	}
	return false
}
