package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"unicode/utf8"

	"github.com/gpulet/gpulet/api"
)

// Who holds a lease, for the lease table: the user's name and the command
// its process runs. gpulet runs on the node, so both are read here, from the
// user database and /proc, rather than sent by gpuletd.

// maxCommand bounds the COMMAND cell, in characters.
const maxCommand = 40

// owners names uids, each looked up once per table.
type owners map[uint32]string

// name is the user name of uid, or the uid where the database has none.
func (o owners) name(uid uint32) string {
	if n, ok := o[uid]; ok {
		return n
	}
	n := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(n); err == nil && u.Username != "" {
		n = u.Username
	}
	o[uid] = n
	return n
}

// commandOf is the command line pid runs, its arguments joined by spaces and
// cut to maxCommand characters; "-" when it cannot be read (gone, or hidden
// by /proc's hidepid).
func commandOf(pid int) string {
	if pid <= 0 {
		return "-"
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	b = bytes.TrimRight(b, "\x00")
	if err != nil || len(b) == 0 {
		return "-"
	}
	s := string(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
	if utf8.RuneCountInString(s) > maxCommand {
		s = string([]rune(s)[:maxCommand-1]) + "…"
	}
	return s
}

// WriteClaims lists the node's offline claims (gpurun --offline), which
// hold units without a lease, after the lease table; nothing when there are
// none.
func WriteClaims(w io.Writer, s *api.Snapshot) {
	var rows [][]string
	names := owners{}
	for _, g := range s.GPUs {
		for _, c := range g.Claims {
			pid := "-"
			if c.PID > 0 {
				pid = strconv.Itoa(c.PID)
			}
			rows = append(rows, []string{strconv.Itoa(g.Index), strconv.Itoa(c.Instance), unitList(c.Units), names.name(c.UID), pid, commandOf(c.PID), usageCell(c.Usage)})
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\noffline claims (gpurun --offline: no lease, released when their process ends):")
	tw := newTable(w, "GPU", "INSTANCE", "UNITS", "USER", "PID", "COMMAND", "MEMORY USED/PEAK (MiB)")
	for _, r := range rows {
		tw.row(r...)
	}
	tw.flush()
}
