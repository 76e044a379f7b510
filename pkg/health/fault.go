// Package health watches the node's GPUs through NVML and turns what it
// finds (XIDs, double-bit ECC errors, a GPU that no longer answers, a MIG
// teardown that failed) into faults: each names the GPU, or one MIG device
// of it, and says when it clears. The plugin turns faults into device
// taints on its ResourceSlices and into the kubelet's device health stream.
package health

import (
	"fmt"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	resourceapi "k8s.io/api/resource/v1"
)

// TaintKeyPrefix is the domain of every taint key the driver sets.
const TaintKeyPrefix = "gpu.gpuaas.io/"

// Fault kinds: the part of the taint key after TaintKeyPrefix. The table
// of keys, values, effects and when each clears is in docs/health.md.
const (
	// KindXID: the GPU (or one MIG device) raised a critical XID; the
	// value is the XID number.
	KindXID = "xid"
	// KindECC: a double-bit ECC error was reported; value "double-bit".
	KindECC = "ecc"
	// KindRowRemap: an uncorrectable memory error left a row remapping
	// pending (applied at the next reset), or the remapping failed; value
	// "pending" or "failed".
	KindRowRemap = "row-remap"
	// KindGPULost: the GPU does not answer NVML (fallen off the bus, or
	// in need of a reset); value "not-answering".
	KindGPULost = "gpu-lost"
	// KindCleanupBlocked: tearing a device down failed (a MIG instance
	// that NVML refuses to destroy); value "mig-destroy".
	KindCleanupBlocked = "cleanup-blocked"
	// KindUnmonitored: NVML cannot deliver XID events for the GPU, so its
	// faults would go unseen; informational (effect None).
	KindUnmonitored = "unmonitored"
)

// MIGScope narrows a fault to one MIG device of a GPU, by where its GPU
// instance sits: the placement names the device whether or not the
// instance still exists.
type MIGScope struct {
	// GIProfileID is the NVML GPU instance profile index.
	GIProfileID int
	Placement   mig.Placement
	// GIID is the GPU instance's ID when the fault was seen.
	GIID int
}

// Fault is one condition of one GPU, or of one MIG device of it.
type Fault struct {
	Kind  string
	Value string
	// GPU is the GPU's UUID.
	GPU string
	// MIG is nil when the fault is the whole GPU's.
	MIG *MIGScope
	// Since is when the fault was first seen (kept while it repeats).
	Since time.Time
	// Until is when a transient fault clears unless seen again; zero
	// means only an observation clears it (recovery, a reset, a retry).
	Until   time.Time
	Message string
	Effect  resourceapi.DeviceTaintEffect
}

// id identifies a fault: a repeat of the same kind on the same device
// renews the existing one rather than adding another.
type id struct {
	kind     string
	gpu      string
	scoped   bool
	giProf   int
	start    int
	size     int
	valueKey string
}

func (f *Fault) id() id {
	i := id{kind: f.Kind, gpu: f.GPU}
	if f.MIG != nil {
		i.scoped, i.giProf, i.start, i.size = true, f.MIG.GIProfileID, f.MIG.Placement.Start, f.MIG.Placement.Size
	}
	if f.Kind == KindXID {
		i.valueKey = f.Value // two different XIDs are two faults
	}
	return i
}

// Taint is the fault as a device taint. TimeAdded is left to the API: the
// slice controller keeps the stored one while the taint is unchanged.
func (f *Fault) Taint() resourceapi.DeviceTaint {
	return resourceapi.DeviceTaint{Key: TaintKeyPrefix + f.Kind, Value: f.Value, Effect: f.Effect}
}

// String says what the fault is, for logs and the kubelet's health message.
func (f *Fault) String() string {
	scope := "GPU " + f.GPU
	if f.MIG != nil {
		scope = fmt.Sprintf("MIG device (GPU instance profile %d at %d+%d) of GPU %s", f.MIG.GIProfileID, f.MIG.Placement.Start, f.MIG.Placement.Size, f.GPU)
	}
	msg := fmt.Sprintf("%s%s=%s on %s", TaintKeyPrefix, f.Kind, f.Value, scope)
	if f.Message != "" {
		msg += ": " + f.Message
	}
	return msg
}

// Unhealthy reports whether the fault makes its device unfit for work;
// informational faults do not.
func (f *Fault) Unhealthy() bool { return f.Effect != resourceapi.DeviceTaintEffectNone }
