package shapes

// NewForeignCachesWith and WithForeignCaches let the package's tests run
// the leader's caches of other drivers' slices over caches of their own.
var NewForeignCachesWith = newForeignCachesWith

func (r *Reconciler) WithForeignCaches(f *foreignCaches) *Reconciler { return r.withForeignCaches(f) }
