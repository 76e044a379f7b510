package controller

import (
	"strings"
	"testing"
)

// TestHardwareProfileNamespaceMustBeANamespaceName: a namespace name is
// accepted, anything else is refused at start, naming the flag, rather
// than every HardwareProfile write failing later.
func TestHardwareProfileNamespaceMustBeANamespaceName(t *testing.T) {
	valid := func(ns string) error {
		o := &Options{HardwareProfileNamespace: ns, Webhook: WebhookOptions{URL: "https://127.0.0.1:9443"}}
		return o.Validate()
	}
	for _, ns := range []string{"", "redhat-ods-applications", "opendatahub"} {
		if err := valid(ns); err != nil {
			t.Errorf("--hardware-profile-namespace %q: %v", ns, err)
		}
	}
	for _, ns := range []string{"Redhat", "a.b", "-x"} {
		if err := valid(ns); err == nil || !strings.Contains(err.Error(), "--hardware-profile-namespace") {
			t.Errorf("--hardware-profile-namespace %q: %v, want refused naming the flag", ns, err)
		}
	}
}

// TestBillingRetentionMonthsMustNotBeNegative: 0 (keep every month) and a
// count of months are accepted, a negative count is refused naming the
// flag.
func TestBillingRetentionMonthsMustNotBeNegative(t *testing.T) {
	for _, months := range []int{0, 1, 13} {
		o := &Options{BillingRetentionMonths: months, Webhook: WebhookOptions{URL: "https://127.0.0.1:9443"}}
		if err := o.Validate(); err != nil {
			t.Errorf("--billing-retention-months %d: %v", months, err)
		}
	}
	o := &Options{BillingRetentionMonths: -1, Webhook: WebhookOptions{URL: "https://127.0.0.1:9443"}}
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--billing-retention-months") {
		t.Errorf("--billing-retention-months -1: %v, want refused naming the flag", err)
	}
}
