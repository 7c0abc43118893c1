package httpjson

import (
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/gpulet/gpulet/api"
)

func TestError(t *testing.T) {
	for _, tc := range []struct {
		err      error
		status   int
		body     string
		internal bool
	}{
		{api.Errorf(api.ErrNotFound, "no lease %q", "x"), 404, `{"error":{"code":"not_found","message":"no lease \"x\""}}` + "\n", false},
		{errors.New("disk on fire"), 500, `{"error":{"code":"internal","message":"disk on fire"}}` + "\n", true},
	} {
		rec := httptest.NewRecorder()
		told := false
		Error(rec, tc.err, func(error) { told = true })
		if rec.Code != tc.status || rec.Body.String() != tc.body || told != tc.internal || rec.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%v: %d %q (internal told %v), want %d %q (%v)", tc.err, rec.Code, rec.Body, told, tc.status, tc.body, tc.internal)
		}
	}
}
