package mig

// BuildDynamicUnpruned is BuildDynamic with every counter of the GPU, as
// published before pruneCounters: the model pruning must agree with.
func BuildDynamicUnpruned(parent Parent, profiles []Profile, units bool) (Layout, error) {
	return buildDynamic(parent, profiles, units, false)
}

// RedundantCounters is what pruneCounters drops from l, computed afresh
// (not from the cache), for the benchmark of its one-time cost.
func RedundantCounters(l *Layout) []string { return redundantCounters(l) }
