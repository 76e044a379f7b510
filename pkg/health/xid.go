package health

// XIDClass says what an XID means for the next tenant of a GPU.
type XIDClass int

const (
	// XIDApplication is raised by a fault of the program running on the
	// GPU (an illegal address, a kernel that was killed); the GPU itself
	// is fine and the next tenant is not at risk. Logged and counted,
	// never tainted.
	XIDApplication XIDClass = iota
	// XIDTransient is a GPU or driver fault that the driver recovers from
	// on its own; the device is tainted until a quiet period passes
	// without the XID again.
	XIDTransient
	// XIDResetRequired leaves the GPU unusable (or its memory suspect)
	// until it is reset: tainted until a reset or a reboot is observed.
	XIDResetRequired
)

func (c XIDClass) String() string {
	switch c {
	case XIDApplication:
		return "application"
	case XIDTransient:
		return "transient"
	default:
		return "reset-required"
	}
}

// xidClasses classifies the XIDs whose meaning is documented. Sources:
// NVIDIA's "XID Errors" reference (docs.nvidia.com/deploy/xid-errors,
// the "Possible causes" and "Recommended action" columns), and the XIDs
// the NVIDIA device plugin skips as application errors by default
// (13, 31, 43, 45, 68, 109). An XID not in the table is treated as
// transient: tainting a GPU for a quiet period costs little, handing a
// broken one to the next tenant costs a job.
var xidClasses = map[uint64]XIDClass{
	13:  XIDApplication,   // graphics engine exception: a program's bad access
	31:  XIDApplication,   // GPU memory page fault: a program's bad pointer
	43:  XIDApplication,   // GPU stopped processing: the program was killed
	45:  XIDApplication,   // preemptive cleanup after a program ended
	68:  XIDApplication,   // NVDEC0 exception raised by a program's stream
	109: XIDApplication,   // context switch timeout: a program's kernel hogged the GPU
	48:  XIDResetRequired, // double-bit ECC error
	63:  XIDResetRequired, // ECC page retirement / row remapping pending
	64:  XIDResetRequired, // ECC page retirement / row remapping failed
	74:  XIDResetRequired, // NVLink error
	79:  XIDResetRequired, // GPU has fallen off the bus
	92:  XIDResetRequired, // high single-bit ECC error rate
	95:  XIDResetRequired, // uncontained ECC error
	119: XIDResetRequired, // GSP RPC timeout
	120: XIDResetRequired, // GSP error
	140: XIDResetRequired, // unrecovered ECC error
	94:  XIDTransient,     // contained ECC error: the program is stopped, the GPU recovers
	62:  XIDTransient,     // internal micro-controller halt
	69:  XIDTransient,     // graphics engine class error
	154: XIDTransient,     // GPU recovery action changed (see the event's recovery action)
}

// ClassifyXID returns the class of an XID.
func ClassifyXID(xid uint64) XIDClass {
	if c, ok := xidClasses[xid]; ok {
		return c
	}
	return XIDTransient
}
