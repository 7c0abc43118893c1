package lease

import (
	"time"

	"github.com/gpulet/gpulet/api"
)

// Request is a validated lease request, with its fields that need parsing
// parsed.
type Request struct {
	api.LeaseRequest
	TTL  time.Duration
	Wait time.Duration
	// MinCapability is MinCC parsed; zero when none is asked.
	MinCapability api.ComputeCapability
}
