package usage

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the use of each prepared claim's devices. Series exist only
// for prepared claims: Forget deletes a claim's. A nil *Metrics records
// nothing.
type Metrics struct {
	utilization *prometheus.GaugeVec
	perUnit     *prometheus.GaugeVec
	memory      *prometheus.GaugeVec
	idleSeconds *prometheus.CounterVec
	known       *prometheus.GaugeVec
}

// labels of every series: pod is the pod the use is of (on a shared GPU
// each pod of the claim; elsewhere the claim's only pod, "" for a claim
// spanning pods), profile the device's DeviceClass, tenant the TenantQuota
// that lists the claim's namespace ("" for none), so that use is summed by
// tenant as the controller's quota and billing metrics are.
var labels = []string{"namespace", "pod", "claim", "device", "profile", "tenant"}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		utilization: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpuaas_claim_gpu_utilization_percent",
			Help: "SM utilization of a claim's device at the last sample, percent of the device (a GPU, a MIG device, the shared GPU); absent while unknown."}, labels),
		perUnit: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpuaas_claim_gpu_utilization_per_unit",
			Help: "gpuaas_claim_gpu_utilization_percent normalized to the GPU units the claim holds of the GPU (a 1/4 time-slice replica at 20% of the GPU: 80)."}, labels),
		memory: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpuaas_claim_gpu_memory_used_bytes",
			Help: "Device memory a claim's processes use on the device at the last sample; absent while unknown."}, labels),
		idleSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuaas_claim_idle_seconds_total",
			Help: "Seconds of idle windows (SM utilization at most the claim's threshold in every sample) of a claim's device."}, labels),
		known: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpuaas_claim_gpu_use_known",
			Help: "1 when NVML could tell the use of a claim's device at the last sample, 0 when not (then its utilization is absent, never 0)."}, labels),
	}
	reg.MustRegister(m.utilization, m.perUnit, m.memory, m.idleSeconds, m.known)
	return m
}

// export records one device's sample; idle is the seconds the window it
// closed adds.
func (m *Metrics) export(r *measured, tenant, solo string, idle float64) {
	if m == nil {
		return
	}
	d := r.d
	if tenant != d.tenant {
		// The namespace moved to another tenant (or its quota came or
		// went): the device's series under the old label go, not to be
		// summed twice.
		m.forgetDevice(d)
		d.tenant, d.prevPods = tenant, nil
	}
	claim := prometheus.Labels{"namespace": d.claim.namespace, "pod": solo, "claim": d.claim.name, "device": d.key.device, "profile": d.profile, "tenant": tenant}
	m.idleSeconds.With(claim).Add(idle)
	if !r.use.known {
		m.known.With(claim).Set(0)
		m.clearUse(d, claim)
		return
	}
	m.known.With(claim).Set(1)
	if len(r.byPod) <= 1 {
		m.setUse(claim, r.use.util, d.perUnitDivisor(), r.memory, r.memKnown)
		return
	}
	// A shared GPU's claim of several pods: a series per pod, none for the
	// claim (one it had while its pods were not known yet goes).
	m.deleteUse(claim)
	live := map[string]bool{}
	for pod, u := range r.byPod {
		l := withPod(claim, pod)
		m.setUse(l, u.util, d.perUnitDivisor(), u.memory, r.memKnown)
		live[pod] = true
	}
	for pod := range d.prevPods {
		if !live[pod] {
			m.deleteUse(withPod(claim, pod))
		}
	}
	d.prevPods = live
}

// perUnitDivisor turns a device's utilization into utilization per GPU
// unit held: on a shared GPU the use is a percentage of the GPU, divided by
// the part of it the claim holds; a MIG device's is already a percentage
// of the instance, the claim's whole device, as a whole GPU's is.
func (d *trackedDevice) perUnitDivisor() float64 {
	if d.kind == sharedGPU {
		return d.share
	}
	return 1
}

func withPod(l prometheus.Labels, pod string) prometheus.Labels {
	out := make(prometheus.Labels, len(l))
	for k, v := range l {
		out[k] = v
	}
	out["pod"] = pod
	return out
}

func (m *Metrics) setUse(l prometheus.Labels, util, share float64, memory uint64, memKnown bool) {
	m.utilization.With(l).Set(util)
	m.perUnit.With(l).Set(util / share)
	if memKnown {
		m.memory.With(l).Set(float64(memory))
	} else {
		m.memory.Delete(l)
	}
}

// clearUse removes the utilization of a device whose use is unknown: an
// absent series, never a 0 that reads as idle.
func (m *Metrics) clearUse(d *trackedDevice, claim prometheus.Labels) {
	m.deleteUse(claim)
	for pod := range d.prevPods {
		m.deleteUse(withPod(claim, pod))
	}
	d.prevPods = nil
}

func (m *Metrics) deleteUse(l prometheus.Labels) {
	m.utilization.Delete(l)
	m.perUnit.Delete(l)
	m.memory.Delete(l)
}

// forgetDevice deletes every series of one device of a claim under its
// tenant label of the last pass.
func (m *Metrics) forgetDevice(d *trackedDevice) {
	l := prometheus.Labels{"namespace": d.claim.namespace, "claim": d.claim.name, "device": d.key.device, "tenant": d.tenant}
	for _, v := range m.vecs() {
		v.DeletePartialMatch(l)
	}
}

func (m *Metrics) vecs() []*prometheus.MetricVec {
	return []*prometheus.MetricVec{m.utilization.MetricVec, m.perUnit.MetricVec, m.memory.MetricVec, m.idleSeconds.MetricVec, m.known.MetricVec}
}

// forget deletes every series of a claim.
func (m *Metrics) forget(namespace, claim string) {
	if m == nil {
		return
	}
	l := prometheus.Labels{"namespace": namespace, "claim": claim}
	for _, v := range m.vecs() {
		v.DeletePartialMatch(l)
	}
}
