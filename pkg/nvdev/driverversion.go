package nvdev

import (
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// driverLibrary matches the real, versioned file of NVML in a driver root:
// libnvidia-ml.so.535.261.03 (the .so.1 link names no version).
var driverLibrary = regexp.MustCompile(`^libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$`)

// InstalledDriverVersion is the version of the NVML library installed
// under driverRoot (the N of libnvidia-ml.so.N in the directories Open
// looks in), or "" when there is none. It reads files only, so it can be
// asked at any time, with or without an NVML session: a driver upgrade
// (the GPU Operator's driver container, a package upgrade) replaces that
// file, and this is how the plugin notices. Where several versions lie
// side by side (an upgrade half done), the newest counts.
func InstalledDriverVersion(driverRoot string) string {
	if driverRoot == "" {
		return ""
	}
	var versions []string
	for _, c := range libraryCandidates {
		matches, _ := filepath.Glob(filepath.Join(driverRoot, filepath.Dir(c), "libnvidia-ml.so.*"))
		for _, m := range matches {
			if v := driverLibrary.FindStringSubmatch(filepath.Base(m)); v != nil {
				versions = append(versions, v[1])
			}
		}
	}
	if len(versions) == 0 {
		return ""
	}
	return slices.MaxFunc(versions, compareVersions)
}

// compareVersions orders dotted driver versions numerically (550.9 is
// older than 550.10).
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range min(len(as), len(bs)) {
		x, _ := strconv.Atoi(as[i])
		y, _ := strconv.Atoi(bs[i])
		if x != y {
			return x - y
		}
	}
	return len(as) - len(bs)
}
