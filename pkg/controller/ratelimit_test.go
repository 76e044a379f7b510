package controller

import (
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// TestAPIClientsAreNotHeldToClientGoDefaults: with client-go's default 5
// requests/s per resource type, the quota ledger's book writes (on the
// admission path) held admissions to about 20 claims/s at 1,000 tenants.
// A configuration without a rate limiter gets the controller's limits;
// one that brings its own limiter keeps it.
func TestAPIClientsAreNotHeldToClientGoDefaults(t *testing.T) {
	got := withRateLimits(&rest.Config{Host: "https://api"}, &Options{})
	if got.QPS != DefaultKubeAPIQPS || got.Burst != DefaultKubeAPIBurst || got.QPS <= rest.DefaultQPS*10 {
		t.Errorf("QPS %v burst %d; want the controller's defaults %d/%d, well above client-go's %v",
			got.QPS, got.Burst, DefaultKubeAPIQPS, DefaultKubeAPIBurst, rest.DefaultQPS)
	}
	if got := withRateLimits(&rest.Config{}, &Options{KubeAPIQPS: 7, KubeAPIBurst: 9}); got.QPS != 7 || got.Burst != 9 {
		t.Errorf("flags ignored: QPS %v burst %d", got.QPS, got.Burst)
	}
	own := flowcontrol.NewFakeAlwaysRateLimiter()
	if got := withRateLimits(&rest.Config{RateLimiter: own}, &Options{}); got.RateLimiter != own || got.QPS != 0 {
		t.Error("a configuration's own rate limiter was replaced")
	}
	if err := (&Options{KubeAPIQPS: -1}).Validate(); err == nil {
		t.Error("a negative QPS was accepted")
	}
}
