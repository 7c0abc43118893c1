package server

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/gpulet/gpulet/api"
)

func TestEndedWhileWaiting(t *testing.T) {
	cancelled := api.Errorf(api.ErrUnavailable, "request cancelled while waiting for units")
	ctx, cancel := context.WithCancel(context.Background())
	r := httptest.NewRequest("POST", "/v1/leases", nil).WithContext(ctx)
	if err := endedWhileWaiting(r, cancelled); err != cancelled {
		t.Errorf("a live request's answer changed: %v", err)
	}
	cancel()
	err := endedWhileWaiting(r, cancelled)
	want := "gpuletd stopped while the request waited for units: nothing was leased; ask again once it is back"
	if !errors.Is(err, api.ErrUnavailable) || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
	other := api.Errorf(api.ErrInsufficientUnits, "no GPU can take 1 unit(s) now")
	if err := endedWhileWaiting(r, other); err != other {
		t.Errorf("another refusal changed: %v", err)
	}
}
