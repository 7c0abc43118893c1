package api

// SnapshotOutcomeHeader is the response header in which gpulet-collector
// says what it did with a snapshot pushed to it, which it answers 204 in
// every case: "applied", "repeated" (the seq of the node's rows again: an
// idle node resending) or SnapshotDropped.
const SnapshotOutcomeHeader = "Gpulet-Snapshot-Outcome"

// SnapshotDropped is the outcome of a snapshot older than the node's rows.
// A node's own pushes never go back, so a node told this learns that
// another sender pushed as it (gpuletd counts it as a failed push).
const SnapshotDropped = "dropped"
