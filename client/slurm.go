package client

import (
	"context"
	"strconv"

	"github.com/gpulet/gpulet/api"
)

// ReleaseSlurmJob ends every lease of Slurm job id (root and admins): what a
// Slurm epilog calls once the job has left the node.
func (c *Client) ReleaseSlurmJob(ctx context.Context, id uint64) (*api.SlurmRelease, error) {
	var r api.SlurmRelease
	if err := c.send(ctx, "DELETE", "/v1/slurm/jobs/"+strconv.FormatUint(id, 10), nil, &r); err != nil {
		return nil, err
	}
	return &r, nil
}
