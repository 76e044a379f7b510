package usage

import (
	"fmt"
	"time"

	gpuaasv1 "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition is a device's Idle condition (gpuaasv1.DeviceConditionIdle) as
// the claim's status.devices entry says it.
type Condition struct {
	Status  metav1.ConditionStatus
	Reason  string
	Message string
	// Since is the condition's lastTransitionTime: for True, the start of
	// the first idle window.
	Since time.Time
}

// sample is one measurement of a claim's use of a device.
type sample struct {
	known bool
	// util is the SM utilization of the claim on the device, percent of
	// the device (a GPU, a MIG device, the shared GPU).
	util float64
	// why NVML cannot tell, when not known.
	why string
	// pending: no measurement yet, none missing either (a MIG device's
	// first GPM sample, which only the next one makes a measurement of);
	// the window does not count it.
	pending bool
}

// judge turns samples into windows and windows into the Idle condition:
// a window is idle when every sample in it is known and at most the
// threshold; one unknown sample makes it unknown (never idle, never 0).
type judge struct {
	window time.Duration
	start  time.Time // of the current window
	// samples, maxUtil and unknown are what the current window has seen.
	samples int
	maxUtil float64
	unknown string
	cond    Condition
}

// newJudge starts a device's first window at now, Unknown/NoSamples: a
// restarted plugin has not seen the past.
func newJudge(now time.Time, window time.Duration) *judge {
	return &judge{window: window, start: now, cond: Condition{Status: metav1.ConditionUnknown,
		Reason: gpuaasv1.ReasonIdleNoSamples, Message: "no full sampling window yet", Since: now.Truncate(time.Second)}}
}

// add takes the sample s taken at now, closing the window it ends with the
// threshold in force. It reports whether the condition's status or reason
// changed, and how many seconds of idleness the closed window adds.
func (j *judge) add(now time.Time, s sample, threshold int32) (changed bool, idleSeconds float64) {
	if end := j.start.Add(j.window); !now.Before(end) {
		next := j.close(threshold)
		idleSeconds = j.idleSeconds(next)
		if now.Sub(end) >= j.window {
			// A whole window passed without a sample: the samples stopped.
			next = Condition{Status: metav1.ConditionUnknown, Reason: gpuaasv1.ReasonIdleNoSamples,
				Message: fmt.Sprintf("no sample from %s to %s", end.Format(time.RFC3339), now.Format(time.RFC3339))}
			idleSeconds = 0
		}
		changed = j.transition(next, end)
		j.start = end.Add(now.Sub(end).Truncate(j.window))
		j.samples, j.maxUtil, j.unknown = 0, 0, ""
	}
	if s.pending {
		return changed, idleSeconds
	}
	j.samples++
	if !s.known {
		if j.unknown == "" {
			j.unknown = s.why
		}
		return changed, idleSeconds
	}
	j.maxUtil = max(j.maxUtil, s.util)
	return changed, idleSeconds
}

// close judges the current window.
func (j *judge) close(threshold int32) Condition {
	switch {
	case j.samples == 0:
		return Condition{Status: metav1.ConditionUnknown, Reason: gpuaasv1.ReasonIdleNoSamples, Message: "no sample in the window"}
	case j.unknown != "":
		return Condition{Status: metav1.ConditionUnknown, Reason: gpuaasv1.ReasonIdleUseUnknown, Message: j.unknown}
	case j.maxUtil <= float64(threshold):
		return Condition{Status: metav1.ConditionTrue, Reason: gpuaasv1.ReasonIdleBelowThreshold,
			Message: fmt.Sprintf("SM utilization at most %.0f%% in %s windows (threshold %d%%)", j.maxUtil, j.window, threshold)}
	default:
		return Condition{Status: metav1.ConditionFalse, Reason: gpuaasv1.ReasonIdleInUse,
			Message: fmt.Sprintf("SM utilization %.0f%% (threshold %d%%)", j.maxUtil, threshold)}
	}
}

func (j *judge) idleSeconds(c Condition) float64 {
	if c.Status == metav1.ConditionTrue {
		return j.window.Seconds()
	}
	return 0
}

// transition moves to next unless its status and reason are the current
// ones (the message then stays as written: a condition is written only
// when it changes). An idle condition starts with its first idle window;
// the others when the window that showed them closed, at end.
func (j *judge) transition(next Condition, end time.Time) bool {
	if next.Status == j.cond.Status && next.Reason == j.cond.Reason {
		return false
	}
	next.Since = end.Truncate(time.Second)
	if next.Status == metav1.ConditionTrue {
		next.Since = ceilSecond(j.start)
	}
	j.cond = next
	return true
}

// ceilSecond rounds t up to the second a condition's lastTransitionTime
// holds. An idleness is vouched for from its first sample on, never
// before: the controller acts on it only if this process's use Lease was
// acquired no later (its acquireTime, microseconds), and a plugin that
// tracked its claims within the second it started would otherwise report
// an idleness older than itself, refused for as long as it lasts.
func ceilSecond(t time.Time) time.Time {
	if r := t.Truncate(time.Second); r.Before(t) {
		return r.Add(time.Second)
	}
	return t
}
