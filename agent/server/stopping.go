package server

import (
	"errors"
	"net/http"

	"github.com/gpulet/gpulet/api"
)

// endedWhileWaiting says why a lease request's context ended while it waited
// for units. Its requester cannot have gone away: then nobody reads this
// answer. So gpuletd is stopping (the stop cancels every request's context
// first, so that waits end at once), which the engine's "request cancelled"
// would leave the user to guess.
func endedWhileWaiting(r *http.Request, err error) error {
	if r.Context().Err() == nil || !errors.Is(err, api.ErrUnavailable) {
		return err
	}
	return api.Errorf(api.ErrUnavailable, "gpuletd stopped while the request waited for units: nothing was leased; ask again once it is back")
}
