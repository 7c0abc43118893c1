package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"text/tabwriter"
)

type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		if i > 0 {
			io.WriteString(t.tw, "\t")
		}
		// Cells hold names and errors others chose; an escaped tab keeps
		// the columns too.
		io.WriteString(t.tw, Printable(c))
	}
	io.WriteString(t.tw, "\n")
}

func (t *table) flush() { t.tw.Flush() }

func writeJSON(w io.Writer, v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(printableJSON(b.Bytes()))
	return err
}
