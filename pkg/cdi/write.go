package cdi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpuaas/gpu-dra-driver/pkg/atomicfile"

	"k8s.io/klog/v2"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// tempInfix marks our temporary files. They start with a dot and do not end
// in .json or .yaml, so neither the CDI cache of the runtime nor
// ClaimSpecUIDs ever reads a half-written spec.
const tempInfix = ".tmp"

func writeSpec(path string, spec *specs.Spec) error {
	data, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("marshal CDI spec: %w", err)
	}
	if err := writeFileAtomic(path, data); err != nil {
		return fmt.Errorf("write CDI spec %q: %w", path, err)
	}
	return nil
}

// writeFileAtomic replaces path with data so that a reader (the container
// runtime) sees either the old or the new content. It is not made durable:
// on real nodes the CDI root is a tmpfs, and where it is not, a spec lost or
// truncated in a power loss is written again at start, as after every
// reboot, from the durable checkpoint record (reboot.go), and a spec without
// a record is deleted. CDI tools run by admins expect world-readable specs
// (specFileMode).
func writeFileAtomic(path string, data []byte) error {
	return atomicfile.Replace(path, data, specFileMode, "."+filepath.Base(path)+tempInfix+"*")
}

// removeStaleTempFiles deletes temp files a crash left behind. Only called
// from NewHandler, before any write of this process can be in flight; the
// other pod of a rolling update may be writing one, which it holds locked
// until renamed (atomicfile.RemoveAbandoned), and is kept.
func removeStaleTempFiles(log klog.Logger, cdiRoot string) {
	entries, err := os.ReadDir(cdiRoot)
	if err != nil {
		log.Error(err, "Listing CDI root for stale temp files", "cdiRoot", cdiRoot)
		return
	}
	prefix := "." + specFilePrefix
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, prefix) || !strings.Contains(name, specFileSuffix+tempInfix) {
			continue
		}
		removed, err := atomicfile.RemoveAbandoned(filepath.Join(cdiRoot, name))
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			log.Error(err, "Removing stale temp file", "file", name)
		case removed:
			log.V(1).Info("Removed stale temp CDI spec", "file", name)
		default:
			log.V(1).Info("Kept a temp CDI spec another process is writing", "file", name)
		}
	}
}
