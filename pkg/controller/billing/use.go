package billing

import (
	"math/big"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// useObs is a device's use as the claim's status says it now: the Idle
// condition the node's plugin writes (docs/usage.md) read as a use and
// the time it began (the condition's lastTransitionTime), and whether
// this leader watched the record up to its lastSeen (false for a previous
// leader's record: what happened between its lastSeen and now was not
// observed).
type useObs struct {
	use     gpuaas.DeviceUse
	since   time.Time
	watched bool
}

// deviceUse reads the device's Idle condition: True is idle, False in
// use, Unknown or none unknown (since the zero time: nothing says when).
func deviceUse(claim *resourceapi.ResourceClaim, d quota.DeviceID) (gpuaas.DeviceUse, time.Time) {
	for i := range claim.Status.Devices {
		s := &claim.Status.Devices[i]
		if s.Driver != d.Driver || s.Pool != d.Pool || s.Device != d.Device {
			continue
		}
		c := meta.FindStatusCondition(s.Conditions, gpuaas.DeviceConditionIdle)
		if c == nil {
			break
		}
		since := c.LastTransitionTime.UTC().Truncate(time.Second)
		switch c.Status {
		case metav1.ConditionTrue:
			return gpuaas.DeviceIdle, since
		case metav1.ConditionFalse:
			return gpuaas.DeviceUsed, since
		default:
			return gpuaas.DeviceUseUnknown, since
		}
	}
	return gpuaas.DeviceUseUnknown, time.Time{}
}

// useOf is the use a record last accounted and since when (a record
// written before uses were recorded: unknown since its start).
func useOf(rec *gpuaas.UsageRecord) (gpuaas.DeviceUse, time.Time) {
	use, since := rec.Use, rec.Start.Time
	if use == "" {
		use = gpuaas.DeviceUseUnknown
	}
	if rec.UseSince != nil && rec.UseSince.After(since) {
		since = rec.UseSince.Time
	}
	return use, since
}

// going is the observation that a record's use goes on as last accounted:
// for the time after the last observation of a record that is closed.
func going(rec *gpuaas.UsageRecord) useObs {
	use, since := useOf(rec)
	return useObs{use: use, since: since, watched: true}
}

// accountUse splits the record's time from its lastSeen up to `to` by use
// and moves lastSeen there, so that used and idle always account
// [start, lastSeen) exactly once and a new leader goes on from the
// record. The boundary between the use accounted so far and the one
// observed now is the condition's lastTransitionTime, within the time
// since the record's use began:
//   - an Idle condition's lastTransitionTime is the start of the idle run,
//     before the plugin wrote it: time already accounted as used or
//     unknown since then becomes idle;
//   - the others' (the end of the plugin's window) are taken from lastSeen
//     on at the earliest: time accounted idle stays idle, so the idle
//     counter never goes down;
//   - the time between lastSeen and a transition that this leader did not
//     watch (a previous leader's record) is unknown: anything may have
//     happened in it.
//
// A `to` at lastSeen (a second reconcile within the second of the last
// one: the plugin writes each claim's status apart) adds no time but
// still takes the observed use: the next observation may be the claim
// gone, and the use it then goes on with is the one recorded here.
func accountUse(rec *gpuaas.UsageRecord, obs useObs, to time.Time) {
	from := rec.LastSeen.Time
	if to.Before(from) {
		return
	}
	defer func() { rec.LastSeen = metav1.NewTime(to) }()
	state, since := useOf(rec)
	if obs.use == state && obs.watched {
		addUse(rec, state, from, to)
		return
	}
	b := clampTime(obs.since, since, to)
	if obs.use == gpuaas.DeviceIdle && state != gpuaas.DeviceIdle && b.Before(from) {
		moveToIdle(rec, state, b, from)
		addUse(rec, gpuaas.DeviceIdle, from, to)
		rec.Use, rec.UseSince = gpuaas.DeviceIdle, ptrTime(b)
		return
	}
	if b.Before(from) {
		b = from
	}
	if b.After(from) {
		before := state
		if !obs.watched {
			before = gpuaas.DeviceUseUnknown
		}
		addUse(rec, before, from, b)
		if before != state {
			rec.Use, rec.UseSince = before, ptrTime(from)
		}
	}
	if obs.since.After(to) {
		return // the transition lies past `to` (a record split at the month's end)
	}
	addUse(rec, obs.use, b, to)
	if obs.use != rec.Use || rec.UseSince == nil {
		rec.Use, rec.UseSince = obs.use, ptrTime(b)
	}
}

func clampTime(t, lo, hi time.Time) time.Time {
	if t.Before(lo) {
		return lo
	}
	if t.After(hi) {
		return hi
	}
	return t
}

// addUse accounts [from, to) of the record as use (unknown is the rest).
func addUse(rec *gpuaas.UsageRecord, use gpuaas.DeviceUse, from, to time.Time) {
	us := unitSecondsBetween(rec.Units, from, to)
	switch use {
	case gpuaas.DeviceIdle:
		rec.IdleUnitSeconds = new(big.Rat).Add(ratOf(rec.IdleUnitSeconds), us).RatString()
	case gpuaas.DeviceUsed:
		rec.UsedUnitSeconds = new(big.Rat).Add(ratOf(rec.UsedUnitSeconds), us).RatString()
	}
}

// moveToIdle accounts [from, to), accounted as use before, as idle.
func moveToIdle(rec *gpuaas.UsageRecord, use gpuaas.DeviceUse, from, to time.Time) {
	us := unitSecondsBetween(rec.Units, from, to)
	if use == gpuaas.DeviceUsed {
		rec.UsedUnitSeconds = new(big.Rat).Sub(ratOf(rec.UsedUnitSeconds), us).RatString()
	}
	rec.IdleUnitSeconds = new(big.Rat).Add(ratOf(rec.IdleUnitSeconds), us).RatString()
}

// settleUse writes the unknown-use unit-seconds: the rest of unitSeconds
// (settled first).
func settleUse(rec *gpuaas.UsageRecord) {
	rec.UsedUnitSeconds, rec.IdleUnitSeconds = ratOf(rec.UsedUnitSeconds).RatString(), ratOf(rec.IdleUnitSeconds).RatString()
	rec.UnknownUseUnitSeconds = unknownOf(rec.UnitSeconds, rec.UsedUnitSeconds, rec.IdleUnitSeconds)
}

// unknownOf is total - used - idle.
func unknownOf(total, used, idle string) string {
	u := new(big.Rat).Sub(ratOf(total), ratOf(used))
	return u.Sub(u, ratOf(idle)).RatString()
}
