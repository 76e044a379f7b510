package controller

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/event"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

func reconcileQuota(t *testing.T, c client.Client, name string) *gpuaas.TenantQuota {
	t.Helper()
	r := &quotaReconciler{client: c, acct: admission.NewAccountant(c, c, admission.NewLedger(c, "gpuaas")), resync: time.Minute}
	if _, err := r.Reconcile(ctx(t), reconcile.Request{NamespacedName: types.NamespacedName{Name: name}}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	var q gpuaas.TenantQuota
	if err := c.Get(ctx(t), types.NamespacedName{Name: name}, &q); err != nil {
		t.Fatal(err)
	}
	return &q
}

func quotaCondition(t *testing.T, q *gpuaas.TenantQuota, typ string) (bool, string) {
	t.Helper()
	c := meta.FindStatusCondition(q.Status.Conditions, typ)
	if c == nil {
		t.Fatalf("no %s condition", typ)
	}
	return c.Status == "True", c.Message
}

func TestQuotaReconcilerStatus(t *testing.T) {
	c := newFakeClient(t, append(world(t), ns("a", nil),
		tenantQuota("team-a", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}, Cohort: "research",
			Limits: gpuaas.QuotaLimits{GpuUnits: qty("1"), Devices: map[string]int64{"mig-1g": 8}}}),
		allocatedTo(claim("a", "mig", "mig-1g", 3), "node-b", "gpu-0-mig-1g-0", "gpu-0-mig-1g-1", "gpu-0-mig-1g-2"),
		claim("a", "waiting", "h100", 1))...)
	q := reconcileQuota(t, c, "team-a")
	s := q.Status
	if s.Used.GpuUnits.String() != "429m" || s.Reserved.GpuUnits.String() != "1" || s.Borrowed.GpuUnits.String() != "429m" ||
		s.Used.Devices["mig-1g"] != 3 || s.Reserved.Devices["h100"] != 1 || s.ClaimsCounted != 2 ||
		s.Used.GpuMemory.String() != "30Gi" || len(s.Namespaces) != 1 {
		t.Fatalf("status = %+v", s)
	}
	if ok, _ := quotaCondition(t, q, gpuaas.ConditionReady); !ok {
		t.Error("not Ready")
	}
	if over, _ := quotaCondition(t, q, gpuaas.ConditionOverQuota); over {
		t.Error("OverQuota although the excess is borrowed within a cohort")
	}
}

func TestQuotaReconcilerFlags(t *testing.T) {
	c := newFakeClient(t, append(world(t), ns("a", nil),
		tenantQuota("older", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}, Limits: gpuaas.QuotaLimits{GpuUnits: qty("1")}}),
		tenantQuota("newer", 1, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}}),
		allocatedTo(claim("a", "two", "h100", 2), "node-a", "gpu-0", "gpu-1"))...)
	older, newer := reconcileQuota(t, c, "older"), reconcileQuota(t, c, "newer")
	if ok, msg := quotaCondition(t, newer, gpuaas.ConditionNamespaceConflict); !ok || !strings.Contains(msg, `namespace a is charged to the older TenantQuota "older"`) {
		t.Errorf("newer: NamespaceConflict %v %q", ok, msg)
	}
	if ok, msg := quotaCondition(t, older, gpuaas.ConditionNamespaceConflict); !ok || !strings.Contains(msg, `also claimed by TenantQuota "newer"`) {
		t.Errorf("older: NamespaceConflict %v %q", ok, msg)
	}
	if ok, msg := quotaCondition(t, older, gpuaas.ConditionOverQuota); !ok || !strings.Contains(msg, "gpuUnits: 2 held, limit 1") {
		t.Errorf("older: OverQuota %v %q", ok, msg)
	}
	if len(newer.Status.Namespaces) != 0 || newer.Status.ClaimsCounted != 0 {
		t.Errorf("newer counts %v / %d claims", newer.Status.Namespaces, newer.Status.ClaimsCounted)
	}
}

func TestQuotaReconcilerInvalid(t *testing.T) {
	c := newFakeClient(t, append(world(t),
		tenantQuota("broken", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}, BorrowingLimit: &gpuaas.BorrowingLimit{}}))...)
	q := reconcileQuota(t, c, "broken")
	if ok, msg := quotaCondition(t, q, gpuaas.ConditionReady); ok || !strings.Contains(msg, "borrowingLimit requires a cohort") {
		t.Fatalf("Ready %v %q", ok, msg)
	}
}

// Issue 12 item 13: every TenantQuota status write requeued every quota
// (N^2 reconciles with N tenants). Only spec changes of a quota, and label
// changes of a namespace, concern the other quotas.
func TestQuotaWatchesIgnoreStatusWrites(t *testing.T) {
	old := teamQuota("team-a", "a", "1")
	old.Generation = 1
	statusOnly := old.DeepCopy()
	statusOnly.Status.ClaimsCounted = 3
	specChanged := old.DeepCopy()
	specChanged.Generation = 2
	if quotaSpecChanged.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: statusOnly}) {
		t.Error("a status write of one quota requeues every quota")
	}
	if !quotaSpecChanged.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: specChanged}) {
		t.Error("a spec change of one quota does not requeue the others")
	}
	nsOld := ns("a", map[string]string{"team": "a"})
	annotated := nsOld.DeepCopy()
	annotated.Annotations = map[string]string{"note": "x"}
	relabelled := nsOld.DeepCopy()
	relabelled.Labels = map[string]string{"team": "b"}
	if namespaceTenancyChanged.Update(event.UpdateEvent{ObjectOld: nsOld, ObjectNew: annotated}) {
		t.Error("an annotation on a namespace requeues every quota")
	}
	if !namespaceTenancyChanged.Update(event.UpdateEvent{ObjectOld: nsOld, ObjectNew: relabelled}) {
		t.Error("a namespace's new labels do not requeue the quotas")
	}
}

// Issue 27: a status write that lost to a newer version (the cache was
// behind) was returned as a reconcile error, and on a healthy cluster the
// GpuaasControllerReconcileErrors alert fired. A conflict requeues the
// quota and is no error.
func TestStatusWriteConflictIsNoError(t *testing.T) {
	api := newFakeClient(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "1"))...)
	conflicting := interceptor.NewClient(api, interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			return apierrors.NewConflict(gpuaas.GroupVersion.WithResource("tenantquotas").GroupResource(), obj.GetName(), errors.New("the object has been modified"))
		},
	})
	r := &quotaReconciler{client: conflicting, acct: admission.NewAccountant(api, api, admission.NewLedger(api, "gpuaas")), resync: time.Minute}
	res, err := r.Reconcile(ctx(t), reconcile.Request{NamespacedName: types.NamespacedName{Name: "team-a"}})
	if err != nil || res.RequeueAfter == 0 {
		t.Fatalf("reconcile after a conflicting status write: %+v, %v; want a requeue and no error", res, err)
	}
}

// Issue 27: a tenant's first denial made its series appear at 1, which
// increase() cannot see, so the at-limit alert missed it. The series exist
// at 0 from the quota's first reconcile.
func TestDenialSeriesStartAtZero(t *testing.T) {
	c := newFakeClient(t, append(world(t), ns("a", nil),
		tenantQuota("zero-series", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"},
			Limits: gpuaas.QuotaLimits{GpuUnits: qty("1"), Devices: map[string]int64{"mig-1g": 2}}}))...)
	registerMetrics()
	reconcileQuota(t, c, "zero-series")
	got := map[string]float64{}
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var series []*dto.Metric
	for _, f := range families {
		if f.GetName() == "gpuaas_claim_denials_total" {
			series = f.GetMetric()
		}
	}
	for _, d := range series {
		labels := map[string]string{}
		for _, l := range d.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["tenant"] == "zero-series" {
			got[labels["resource"]] = d.GetCounter().GetValue()
		}
	}
	want := map[string]float64{quota.ResourceGpuUnits: 0, "devices/mig-1g": 0}
	if !maps.Equal(got, want) {
		t.Errorf("denial series before any denial: %v, want %v", got, want)
	}
}
