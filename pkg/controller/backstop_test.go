package controller

import (
	"maps"
	"testing"
)

// Issue 36, route 6: a ResourceQuota counts a claim's devices under the
// class it names, so every class reaching a limited profile's devices gets
// a line; at the sum of what it reaches, so that nothing the webhook admits
// is refused; a line the admin wrote is taken as written.
func TestBackstopLinesCoverEveryClassReachingALimitedProfile(t *testing.T) {
	limits := map[string]int64{"h100": 2, "a100": 3, "named-catch-all": 8}
	reached := map[string][]string{
		"h100":            {"h100"},
		"a100":            {"a100"},
		"any-gpu":         {"a100", "h100", "l4"},
		"shared-mps":      {"h100", "shared-mps"}, // another profile's class over h100's devices
		"l4":              {"l4"},                 // no limit: no line
		"nic.example.com": nil,
		"named-catch-all": {"a100", "h100"},
		"h100-zero":       {"h100-zero"},
	}
	got := classLines(limits, reached)
	want := map[string]int64{"h100": 2, "a100": 3, "named-catch-all": 8, "any-gpu": 5, "shared-mps": 2}
	if !maps.Equal(got, want) {
		t.Errorf("lines %v, want %v", got, want)
	}
	if got := classLines(map[string]int64{"h100": 0}, reached); !maps.Equal(got, map[string]int64{"h100": 0, "any-gpu": 0, "shared-mps": 0, "named-catch-all": 0}) {
		t.Errorf("with h100: 0, lines %v: every class reaching an H100 must be held at 0", got)
	}
	if got := classLines(nil, reached); len(got) != 0 {
		t.Errorf("no limits, lines %v", got)
	}
}
