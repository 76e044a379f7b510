package posture

// The names this package repeats from the plugin's packages (which link
// NVML), for posture_test to check against the originals.
const (
	PluginTaintPrefix        = pluginTaintPrefix
	TaintCleanupBlocked      = taintCleanupBlocked
	TaintUnmonitored         = taintUnmonitoredKind
	MemorySliceCounterPrefix = memorySliceCounterPrefix
	CounterGPUMilliunits     = counterGPUMilliunits
)

// Attributes are the attribute names read from devices.
var Attributes = []string{attrType, attrUUID, attrParentUUID, attrIndex, attrProductName, attrProfile, attrMemoryLimitEnforced}
