package server

import (
	"strings"
	"testing"

	"github.com/gpulet/gpulet/api"
	"github.com/gpulet/gpulet/identity"
)

func (f *fakeCore) ReleaseSlurmJob(p identity.Peer, job uint64) ([]string, error) {
	if !p.Admin {
		return nil, api.Errorf(api.ErrForbidden, "for root and the admin group")
	}
	if job == 12 {
		return []string{"l-1"}, nil
	}
	return []string{}, nil
}

func TestReleaseSlurmJobRoute(t *testing.T) {
	c := serve(t, newFakeCore(t))
	for _, tc := range []struct {
		path     string
		status   int
		contains string
	}{
		{"/v1/slurm/jobs/12", 200, `{"job_id":12,"released":["l-1"]}`},
		{"/v1/slurm/jobs/13", 200, `{"job_id":13,"released":[]}`},
		{"/v1/slurm/jobs/0", 400, "not a job id"},
		{"/v1/slurm/jobs/x1", 400, "not a job id"},
		{"/v1/slurm/jobs/-1", 400, "not a job id"},
	} {
		status, _, body := do(t, c, "DELETE", tc.path, "")
		if status != tc.status || !strings.Contains(body, tc.contains) {
			t.Errorf("DELETE %s = %d %s; want %d containing %s", tc.path, status, body, tc.status, tc.contains)
		}
	}
}
