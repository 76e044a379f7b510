// Package billing keeps the usage records a bill is made of: one
// TenantUsage per tenant and UTC month, written by the controller's leader
// (docs/platform.md, "Billing").
//
// A record is one claim's hold of one device at one price over
// [start, end). Its start is written when the leader first sees the device
// allocated, its lastSeen every resync, its end when the allocation goes
// (or the price changes, or the month ends: the record is split there).
// Unit-seconds and cost are computed from start and end, never added up
// from increments, so a new leader that starts from the TenantUsages in the
// API bills nothing twice: an allocation still there continues its record
// (the time no leader ran lies inside [start, now]); one that went while no
// leader ran is closed at its lastSeen, endUncertain, never billed past
// what was observed. Writes that fail are kept in memory and retried.
//
// Each record also splits its time by the device's use, from the Idle
// condition the node's plugin writes into the claim's status: used, idle
// and unknown, at the condition's lastTransitionTime; the record carries
// the use it last counted, so a new leader goes on from it (use.go).
//
// The gpu-unit-seconds, cost and idle counters are derived from the same
// records (metrics.go). TenantUsages past the retention are deleted, their
// usage kept in the counters (retention.go).
package billing
