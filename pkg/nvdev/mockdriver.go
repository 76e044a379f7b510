package nvdev

import (
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// driverLibrary matches the real, versioned file of NVML in a driver root:
// libnvidia-ml.so.535.261.03 (the .so.1 link names no version).
var driverLibrary = regexp.MustCompile(`^libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)$`)

// cudaOfDriver is the CUDA driver API version each driver branch reports
// (nvidia-smi's "CUDA Version"), for the branches a driver root here may
// hold; others keep the mock machine's.
var cudaOfDriver = map[string]int{"535": 12020, "550": 12040, "560": 12060, "570": 12080, "575": 12090, "580": 13000}

// installedDriverVersion is the version of the NVML library installed
// under driverRoot, or "" when there is none.
func installedDriverVersion(driverRoot string) string {
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
	slices.Sort(versions)
	if len(versions) == 0 {
		return ""
	}
	return versions[len(versions)-1]
}

// pairWithDriverRoot makes a mock machine report the driver of the real
// driver userspace under driverRoot, when there is one: nvcdi looks for the
// libraries of the version NVML reports, and a mock saying 550.54.15 over a
// 535.261.03 install would find no driver files to give containers.
func pairWithDriverRoot(s *server.Server, driverRoot string) {
	version := installedDriverVersion(driverRoot)
	if version == "" {
		return
	}
	s.DriverVersion = version
	branch, _, _ := strings.Cut(version, ".")
	if cuda, ok := cudaOfDriver[branch]; ok {
		s.CudaDriverVersion = cuda
	}
}
