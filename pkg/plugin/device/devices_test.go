package device

import (
	"regexp"
	"testing"
)

func TestSemver(t *testing.T) {
	re := regexp.MustCompile(`^\d+\.\d+\.\d+$`)
	for in, want := range map[string]string{"9.0": "9.0.0", "12.4": "12.4.0", "535.104.05": "535.104.5", "550.54.15": "550.54.15", "10": "10.0.0"} {
		if got := semver(in); got != want || !re.MatchString(got) {
			t.Errorf("semver(%q) = %q, want %q", in, got, want)
		}
	}
}
