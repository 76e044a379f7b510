package main

/*
#include <stdint.h>
*/
import "C"

import (
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Per-cgroup memory limits (driver r615 and later), which NVIDIA's CDI
// hook apply-cuda-memory-limits sets through go-nvml: the simulated
// machine checks and keeps them (pkg/nvdev/nvmock/mockmemlimits.go). The
// C structs (nvmlSetMemoryLimits_v1_t, nvmlGetMemoryLimits_v1_t) have the
// layout of go-nvml's SetMemoryLimits_v1 and GetMemoryLimits_v1: the
// cgroup's path as a C string, then the limits in bytes.

//export nvmlDeviceSetMemoryLimits_v1
func nvmlDeviceSetMemoryLimits_v1(h C.uintptr_t, limits unsafe.Pointer) C.int {
	return onDevice("nvmlDeviceSetMemoryLimits_v1", h, func(d nvml.Device) nvml.Return {
		l := (*nvml.SetMemoryLimits_v1)(limits)
		if l == nil || l.NameSpace == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return d.SetMemoryLimits_v1(C.GoString((*C.char)(unsafe.Pointer(l.NameSpace))), l.SoftLimit, l.HardLimit)
	})
}

//export nvmlDeviceGetMemoryLimits_v1
func nvmlDeviceGetMemoryLimits_v1(h C.uintptr_t, limits unsafe.Pointer) C.int {
	return onDevice("nvmlDeviceGetMemoryLimits_v1", h, func(d nvml.Device) nvml.Return {
		l := (*nvml.GetMemoryLimits_v1)(limits)
		if l == nil || l.NameSpace == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		got, ret := d.GetMemoryLimits_v1(C.GoString((*C.char)(unsafe.Pointer(l.NameSpace))))
		if ret == nvml.SUCCESS {
			l.SoftLimit, l.HardLimit, l.CurrentUsed = got.SoftLimit, got.HardLimit, got.CurrentUsed
		}
		return ret
	})
}
