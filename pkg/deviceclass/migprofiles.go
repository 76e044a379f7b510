package deviceclass

import (
	"regexp"
	"slices"
	"strings"
)

// migProfilePattern is the syntax of a MIG profile name: GPU-instance
// slices, memory, optional media-extension suffix, optionally preceded by a
// compute-instance size ("1c.3g.40gb"). The CRD enforces the same pattern.
var migProfilePattern = regexp.MustCompile(`^([1-7]c\.)?[1-8]g\.[0-9]+gb(\+me|\+me\.all|\+gfx|-me)?$`)

// knownMigProfiles are the GPU-instance profiles of the MIG-capable GPUs
// (NVIDIA MIG user guide: A30, A100 40/80 GB, H100 80/94/96 GB, H200, B200,
// GB200). A well-formed name outside this list is most likely a typo
// ("1g.11gb"); profiles of newer GPUs are accepted once a node publishes
// them.
var knownMigProfiles = map[string]bool{}

func init() {
	for _, p := range []string{
		// A30 24GB
		"1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb",
		// A100 40GB
		"1g.5gb", "1g.5gb+me", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb",
		// A100 80GB, H100 80GB
		"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
		// H100 NVL 94GB
		"1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb",
		// GH200 96GB
		"3g.48gb", "4g.48gb", "7g.96gb",
		// H200 141GB
		"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
		// B200 180GB
		"1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb",
		// GB200 186GB
		"1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb",
	} {
		knownMigProfiles[p] = true
	}
}

// KnownMigProfiles lists the built-in profile names, sorted.
func KnownMigProfiles() []string {
	out := make([]string, 0, len(knownMigProfiles))
	for p := range knownMigProfiles {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// gpuInstanceProfile strips a compute-instance prefix: "1c.3g.40gb" ->
// "3g.40gb".
func gpuInstanceProfile(name string) string {
	if i := strings.Index(name, "c."); i > 0 && i < 2 {
		return name[i+2:]
	}
	return name
}
