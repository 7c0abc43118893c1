package api

// The answers of the routes that show the config in force: the task–engine
// affinity table, the pools and the quotas.

// ProfileList is the body of GET /v1/profiles: the task–engine affinity
// table, tasks by name, each task's models fastest first.
type ProfileList struct {
	// Profiles is the table as placement uses it for the caller: the
	// config's figures, with the caller's own measured runs over them.
	Profiles []TaskProfile `json:"profiles"`
	// Learned is, for admins only, every user's measured run times, by
	// uid; other callers see only their own (in Profiles).
	Learned []UserProfiles `json:"learned,omitempty"`
}

// UserProfiles are one user's measured run times.
type UserProfiles struct {
	UID      uint32        `json:"uid"`
	Profiles []TaskProfile `json:"profiles"`
}

// TaskProfile is one task's run times.
type TaskProfile struct {
	Task   string         `json:"task"`
	Models []ModelRunTime `json:"models"`
}

// ModelRunTime is a task's run time on one GPU model, and how many measured
// runs it rests on (0: the config file's figure alone).
type ModelRunTime struct {
	Model   string  `json:"model"`
	Seconds float64 `json:"seconds"`
	Runs    int     `json:"runs"`
}

// PoolList is the body of GET /v1/pools: the configured pools and whether
// the caller may lease in each.
type PoolList struct {
	Pools []Pool `json:"pools"`
	// SkippedRules are the config's rules left out because a user or group
	// name could not be resolved (a user deleted since, a directory service
	// down), one line each: "line 4: pools.p.users[1]: no user \"bob\" on
	// this machine; the pool's entry is skipped".
	SkippedRules []string `json:"skipped_rules,omitempty"`
}

// Pool is one pool of the config file.
type Pool struct {
	Name      string `json:"name"`
	GPUs      []int  `json:"gpus"`
	UnitsFree int    `json:"units_free"`
	// Allowed says whether the caller may lease there.
	Allowed bool `json:"allowed"`
}

// QuotaList is the body of GET /v1/quotas: the quotas that apply to the
// caller and what is held against each. Admins are bound by none.
type QuotaList struct {
	Admin  bool         `json:"admin"`
	Quotas []QuotaUsage `json:"quotas"`
}

// QuotaOver is a quota held above its limit: offline claims (which nothing
// can refuse), a quota lowered by a reload, or reservations taken back at
// start lifted it there. Its holders get no new lease until it is back
// under.
type QuotaOver struct {
	// Quota is the quota as the config file names it: alice, group:ml, *.
	Quota string `json:"quota"`
	Limit int    `json:"limit"`
	// Held counts leases and offline claims; Reserved the units
	// reservations set aside beyond those.
	Held     int `json:"held"`
	Reserved int `json:"reserved,omitempty"`
}

// QuotaUsage is one quota that applies to the caller.
type QuotaUsage struct {
	// Quota is the quota as the config file names it: alice, group:ml, *.
	Quota string `json:"quota"`
	Limit int    `json:"limit"`
	Held  int    `json:"held"`
	// Reserved is what reservations set aside against the quota beyond
	// the units their owners' own leases on them hold (pending ones
	// included): it counts toward the limit as held units do.
	Reserved int `json:"reserved,omitempty"`
}
