package collector

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gpulet/gpulet/api"
)

// queryStore has three working nodes, one draining and one stale:
//
//	a: GPU0 A100 free 5, GPU1 T4 free 4 (not eligible), GPU2 A100 free 3
//	b: GPU0 A100 free 5, GPU1 T4 free 4
//	c: GPU0 A100 free 8
//	d (draining): GPU0 A100 free 8
//	e (not_working): GPU0 A100 free 8
func queryStore(t testing.TB) *Store {
	t.Helper()
	clock := newFakeClock()
	st := NewStore(15*time.Second, clock.Now)
	e := testSnapshot("e", "b", 1, 8, 1)
	st.Apply(e)
	clock.Add(20 * time.Second)
	a := testSnapshot("a", "b", 1, 5, 3)
	a.GPUs[1].Eligible = false
	st.Apply(a)
	st.Apply(testSnapshot("b", "b", 1, 5, 2))
	st.Apply(testSnapshot("c", "b", 1, 8, 1))
	d := testSnapshot("d", "b", 1, 8, 1)
	d.State = api.NodeDraining
	st.Apply(d)
	return st
}

func rowNames(rows []Row) string {
	var s []string
	for _, r := range rows {
		s = append(s, fmt.Sprintf("%s%d", r.Node, r.GPUIndex))
	}
	return strings.Join(s, " ")
}

func TestTableQueries(t *testing.T) {
	st := queryStore(t)
	tests := []struct {
		query string
		want  string
	}{
		{"", "a0 a1 a2 b0 b1 c0 d0 e0"},
		{"node=b", "b0 b1"},
		{"node=zzz", ""},
		{"type=a100", "a0 a2 b0 c0 d0 e0"},
		{"type=T4", "a1 b1"},
		{"type=sxm4-80", "a0 a2 b0 c0 d0 e0"},
		{"type=H100", ""},
		{"min_free=5", "a0 b0 c0 d0 e0"},
		{"min_free=0", "a0 a1 a2 b0 b1 c0 d0 e0"},
		{"eligible=true", "a0 a2 b0 b1 c0"},
		{"eligible=false", "a0 a1 a2 b0 b1 c0 d0 e0"},
		{"order=most_free", "c0 d0 e0 a0 b0 a1 b1 a2"},
		{"order=least_free", "a2 a1 b1 a0 b0 c0 d0 e0"},
		{"limit=3", "a0 a1 a2"},
		{"limit=100", "a0 a1 a2 b0 b1 c0 d0 e0"},
		{"order=most_free&limit=4", "c0 d0 e0 a0"},
		{"order=least_free&limit=1", "a2"},
		{"type=A100&min_free=4&eligible=true&order=most_free", "c0 a0 b0"},
		{"type=A100&min_free=4&eligible=true&order=most_free&limit=2", "c0 a0"},
		{"node=a&type=a100&order=least_free", "a2 a0"},
		{"node=a&eligible=true&min_free=4", "a0"},
		{"node=e&eligible=true", ""},
		{"type=t4&order=most_free&limit=1", "a1"},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			v, err := url.ParseQuery(tt.query)
			if err != nil {
				t.Fatal(err)
			}
			q, err := ParseQuery(v)
			if err != nil {
				t.Fatal(err)
			}
			rows := st.Table(q).Rows
			if got := rowNames(rows); got != tt.want {
				t.Fatalf("rows %q, want %q", got, tt.want)
			}
			for _, r := range rows {
				if (r.Node == "e") != (r.NodeState == NotWorking) || (r.Node == "e") != (r.GPUState == NotWorking) {
					t.Errorf("row %s%d: node_state %q gpu_state %q", r.Node, r.GPUIndex, r.NodeState, r.GPUState)
				}
			}
		})
	}
}

// TestTableTopN: the bounded selection a small limit uses gives the same
// rows as sorting all of them.
func TestTableTopN(t *testing.T) {
	st := NewStore(time.Minute, nil)
	for n := 0; n < 300; n++ {
		st.Apply(testSnapshot(fmt.Sprintf("n%03d", (n*37)%300), "b", 1, n%9, 8))
	}
	for _, order := range []string{"", OrderMostFree, OrderLeastFree} {
		all := st.Table(Query{Order: order}).Rows
		for _, limit := range []int{1, 7, 20, 299, 2400, 5000} {
			got := st.Table(Query{Order: order, Limit: limit}).Rows
			want := all[:min(limit, len(all))]
			if rowNames(got) != rowNames(want) {
				t.Fatalf("order %q limit %d: got %d rows that differ from the first of the full order", order, limit, len(got))
			}
		}
	}
}

func TestParseQueryBadValues(t *testing.T) {
	tests := []struct{ query, param string }{
		{"min_free=-1", "min_free"},
		{"min_free=x", "min_free"},
		{"min_free=", "min_free"},
		{"limit=0", "limit"},
		{"limit=-3", "limit"},
		{"limit=ten", "limit"},
		{"eligible=maybe", "eligible"},
		{"order=random", "order"},
		{"order=", "order"},
		{"node=", "node"},
		{"type=", "type"},
		{"node=a&node=b", "node"},
		{"colour=red", "colour"},
		{"type=a100&limit=0", "limit"},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			v, _ := url.ParseQuery(tt.query)
			_, err := ParseQuery(v)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), "query parameter "+tt.param+":") {
				t.Fatalf("error %q does not name %s", err, tt.param)
			}
		})
	}
}

// GET /v1/table answers at most MaxTableRows rows; the rest is read a page
// at a time, each page pointing to the next, the pages together being the
// whole table in order.
func TestTablePages(t *testing.T) {
	st := NewStore(time.Minute, nil)
	for n := range 30 {
		st.Apply(testSnapshot(fmt.Sprintf("n%02d", n), "b", 1, n%7, 4))
	}
	s := NewServer(st, nil)
	s.MaxTableRows = 50
	for _, order := range []string{"", "&order=most_free", "&order=least_free"} {
		var all []Row
		offset := 0
		for page := 0; ; page++ {
			code, b := do(t, s, "GET", fmt.Sprintf("/v1/table?offset=%d%s", offset, order), nil)
			var tab Table
			if code != 200 || json.Unmarshal(b, &tab) != nil || len(tab.Rows) > 50 {
				t.Fatalf("page %d: %d, %d rows", page, code, len(tab.Rows))
			}
			all = append(all, tab.Rows...)
			if tab.NextOffset == 0 {
				break
			}
			offset = tab.NextOffset
		}
		want := st.Table(Query{Order: strings.TrimPrefix(order, "&order=")}).Rows
		if len(want) != 120 || rowNames(all) != rowNames(want) {
			t.Fatalf("order %q: pages hold %d rows, the table %d", order, len(all), len(want))
		}
	}
	code, b := do(t, s, "GET", "/v1/table?limit=20&offset=110&order=most_free", nil)
	var tab Table
	if json.Unmarshal(b, &tab); code != 200 || len(tab.Rows) != 10 || tab.NextOffset != 0 {
		t.Fatalf("the last page: %d, %d rows, next %d", code, len(tab.Rows), tab.NextOffset)
	}
	for _, bad := range []string{"offset=-1", "offset=x", "offset=9999999999999", "limit=9999999999999"} {
		if code, _ := do(t, s, "GET", "/v1/table?"+bad, nil); code != 400 {
			t.Errorf("%s: %d, want 400", bad, code)
		}
	}
}

// FuzzParseQuery: no query string makes the parser or the table panic, and
// an accepted query answers within its limit.
func FuzzParseQuery(f *testing.F) {
	for _, s := range []string{"", "limit=3&offset=2", "order=most_free&type=a100", "offset=1073741824&limit=1073741824", "min_free=-1", "node=a&node=b"} {
		f.Add(s)
	}
	st := queryStore(f)
	f.Fuzz(func(t *testing.T, raw string) {
		v, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		q, err := ParseQuery(v)
		if err != nil {
			return
		}
		if rows := st.Table(q).Rows; q.Limit > 0 && len(rows) > q.Limit {
			t.Fatalf("%q: %d rows past the limit %d", raw, len(rows), q.Limit)
		}
	})
}
