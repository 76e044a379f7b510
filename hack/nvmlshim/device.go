package main

/*
#include <stdint.h>
*/
import "C"

import (
	"strings"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The C structs NVML's calls fill have the layout of go-nvml's Go types
// (generated from nvml.h by cgo -godefs); those without handles are
// written through them, those with handles through the mirrors in mig.go.

//export nvmlSystemGetDriverVersion
func nvmlSystemGetDriverVersion(buf *C.char, n C.uint) C.int {
	return call("nvmlSystemGetDriverVersion", func(lib nvml.Interface) nvml.Return {
		v, ret := lib.SystemGetDriverVersion()
		if ret != nvml.SUCCESS {
			return ret
		}
		return putString(buf, n, v)
	})
}

//export nvmlSystemGetNVMLVersion
func nvmlSystemGetNVMLVersion(buf *C.char, n C.uint) C.int {
	return call("nvmlSystemGetNVMLVersion", func(lib nvml.Interface) nvml.Return {
		v, ret := lib.SystemGetDriverVersion()
		if ret != nvml.SUCCESS {
			return ret
		}
		// NVML's version is the driver's with a 12 in front: 12.535.261.03.
		return putString(buf, n, "12."+v)
	})
}

func cudaVersion(name string, out *C.int) C.int {
	return call(name, func(lib nvml.Interface) nvml.Return {
		v, ret := lib.SystemGetCudaDriverVersion()
		if ret == nvml.SUCCESS && out != nil {
			*out = C.int(v)
		}
		return ret
	})
}

//export nvmlSystemGetCudaDriverVersion
func nvmlSystemGetCudaDriverVersion(out *C.int) C.int {
	return cudaVersion("nvmlSystemGetCudaDriverVersion", out)
}

//export nvmlSystemGetCudaDriverVersion_v2
func nvmlSystemGetCudaDriverVersion_v2(out *C.int) C.int {
	return cudaVersion("nvmlSystemGetCudaDriverVersion_v2", out)
}

//export nvmlSystemGetProcessName
func nvmlSystemGetProcessName(pid C.uint, buf *C.char, n C.uint) C.int {
	return call("nvmlSystemGetProcessName", func(lib nvml.Interface) nvml.Return {
		name, ret := lib.SystemGetProcessName(int(pid))
		if ret != nvml.SUCCESS {
			return ret
		}
		return putString(buf, n, name)
	})
}

func deviceCount(name string, out *C.uint) C.int {
	return call(name, func(lib nvml.Interface) nvml.Return {
		n, ret := lib.DeviceGetCount()
		if ret == nvml.SUCCESS {
			*out = C.uint(n)
		}
		return ret
	})
}

//export nvmlDeviceGetCount_v2
func nvmlDeviceGetCount_v2(out *C.uint) C.int { return deviceCount("nvmlDeviceGetCount_v2", out) }

//export nvmlDeviceGetCount
func nvmlDeviceGetCount(out *C.uint) C.int { return deviceCount("nvmlDeviceGetCount", out) }

func putDevice(out *C.uintptr_t, d nvml.Device, ret nvml.Return) nvml.Return {
	if ret != nvml.SUCCESS {
		return ret
	}
	if out == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	*out = handles.of(d)
	return nvml.SUCCESS
}

func handleByIndex(name string, i C.uint, out *C.uintptr_t) C.int {
	return call(name, func(lib nvml.Interface) nvml.Return {
		d, ret := lib.DeviceGetHandleByIndex(int(i))
		return putDevice(out, d, ret)
	})
}

//export nvmlDeviceGetHandleByIndex_v2
func nvmlDeviceGetHandleByIndex_v2(i C.uint, out *C.uintptr_t) C.int {
	return handleByIndex("nvmlDeviceGetHandleByIndex_v2", i, out)
}

//export nvmlDeviceGetHandleByIndex
func nvmlDeviceGetHandleByIndex(i C.uint, out *C.uintptr_t) C.int {
	return handleByIndex("nvmlDeviceGetHandleByIndex", i, out)
}

//export nvmlDeviceGetHandleByUUID
func nvmlDeviceGetHandleByUUID(id *C.char, out *C.uintptr_t) C.int {
	return call("nvmlDeviceGetHandleByUUID", func(lib nvml.Interface) nvml.Return {
		if id == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		d, ret := lib.DeviceGetHandleByUUID(C.GoString(id))
		return putDevice(out, d, ret)
	})
}

func handleByBusID(name string, id *C.char, out *C.uintptr_t) C.int {
	return call(name, func(lib nvml.Interface) nvml.Return {
		if id == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		want := normalizeBusID(C.GoString(id))
		n, ret := lib.DeviceGetCount()
		if ret != nvml.SUCCESS {
			return ret
		}
		for i := range n {
			d, ret := lib.DeviceGetHandleByIndex(i)
			if ret != nvml.SUCCESS {
				continue
			}
			if pci, ret := d.GetPciInfo(); ret == nvml.SUCCESS && normalizeBusID(goString(pci.BusId[:])) == want {
				return putDevice(out, d, ret)
			}
		}
		return nvml.ERROR_NOT_FOUND
	})
}

//export nvmlDeviceGetHandleByPciBusId_v2
func nvmlDeviceGetHandleByPciBusId_v2(id *C.char, out *C.uintptr_t) C.int {
	return handleByBusID("nvmlDeviceGetHandleByPciBusId_v2", id, out)
}

//export nvmlDeviceGetHandleByPciBusId
func nvmlDeviceGetHandleByPciBusId(id *C.char, out *C.uintptr_t) C.int {
	return handleByBusID("nvmlDeviceGetHandleByPciBusId", id, out)
}

// normalizeBusID compares "00000000:3B:00.0" and "0000:3b:00.0" alike.
func normalizeBusID(id string) string {
	id = strings.ToLower(id)
	domain, rest, ok := strings.Cut(id, ":")
	if !ok {
		return id
	}
	return strings.TrimLeft(domain, "0") + ":" + rest
}

func goString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

// onDevice runs f on the device behind handle h.
func onDevice(name string, h C.uintptr_t, f func(d nvml.Device) nvml.Return) C.int {
	return call(name, func(nvml.Interface) nvml.Return {
		d, ret := device(h)
		if ret != nvml.SUCCESS {
			return ret
		}
		return f(d)
	})
}

func stringOf(name string, h C.uintptr_t, buf *C.char, n C.uint, get func(nvml.Device) (string, nvml.Return)) C.int {
	return onDevice(name, h, func(d nvml.Device) nvml.Return {
		s, ret := get(d)
		if ret != nvml.SUCCESS {
			return ret
		}
		return putString(buf, n, s)
	})
}

//export nvmlDeviceGetName
func nvmlDeviceGetName(h C.uintptr_t, buf *C.char, n C.uint) C.int {
	return stringOf("nvmlDeviceGetName", h, buf, n, nvml.Device.GetName)
}

//export nvmlDeviceGetUUID
func nvmlDeviceGetUUID(h C.uintptr_t, buf *C.char, n C.uint) C.int {
	return stringOf("nvmlDeviceGetUUID", h, buf, n, nvml.Device.GetUUID)
}

//export nvmlDeviceGetSerial
func nvmlDeviceGetSerial(h C.uintptr_t, buf *C.char, n C.uint) C.int {
	return stringOf("nvmlDeviceGetSerial", h, buf, n, nvml.Device.GetSerial)
}

//export nvmlDeviceGetVbiosVersion
func nvmlDeviceGetVbiosVersion(h C.uintptr_t, buf *C.char, n C.uint) C.int {
	return stringOf("nvmlDeviceGetVbiosVersion", h, buf, n, nvml.Device.GetVbiosVersion)
}

func uintOf(name string, h C.uintptr_t, out *C.uint, get func(nvml.Device) (int, nvml.Return)) C.int {
	return onDevice(name, h, func(d nvml.Device) nvml.Return {
		v, ret := get(d)
		if ret == nvml.SUCCESS {
			if out == nil {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			*out = C.uint(v)
		}
		return ret
	})
}

//export nvmlDeviceGetIndex
func nvmlDeviceGetIndex(h C.uintptr_t, out *C.uint) C.int {
	return uintOf("nvmlDeviceGetIndex", h, out, nvml.Device.GetIndex)
}

//export nvmlDeviceGetMinorNumber
func nvmlDeviceGetMinorNumber(h C.uintptr_t, out *C.uint) C.int {
	return uintOf("nvmlDeviceGetMinorNumber", h, out, nvml.Device.GetMinorNumber)
}

//export nvmlDeviceGetNumaNodeId
func nvmlDeviceGetNumaNodeId(h C.uintptr_t, out *C.uint) C.int {
	return uintOf("nvmlDeviceGetNumaNodeId", h, out, nvml.Device.GetNumaNodeId)
}

//export nvmlDeviceGetMaxMigDeviceCount
func nvmlDeviceGetMaxMigDeviceCount(h C.uintptr_t, out *C.uint) C.int {
	return uintOf("nvmlDeviceGetMaxMigDeviceCount", h, out, nvml.Device.GetMaxMigDeviceCount)
}

//export nvmlDeviceGetGpuInstanceId
func nvmlDeviceGetGpuInstanceId(h C.uintptr_t, out *C.uint) C.int {
	return uintOf("nvmlDeviceGetGpuInstanceId", h, out, nvml.Device.GetGpuInstanceId)
}

//export nvmlDeviceGetComputeInstanceId
func nvmlDeviceGetComputeInstanceId(h C.uintptr_t, out *C.uint) C.int {
	return uintOf("nvmlDeviceGetComputeInstanceId", h, out, nvml.Device.GetComputeInstanceId)
}

//export nvmlDeviceGetBrand
func nvmlDeviceGetBrand(h C.uintptr_t, out *C.uint) C.int {
	return uintOf("nvmlDeviceGetBrand", h, out, func(d nvml.Device) (int, nvml.Return) {
		b, ret := d.GetBrand()
		return int(b), ret
	})
}

// nvmlDeviceGetVirtualizationMode: the simulated machines are bare metal
// (no vGPU host or guest, no passthrough), so every GPU answers
// NVML_GPU_VIRTUALIZATION_MODE_NONE, as a bare-metal H100 does. NVIDIA's
// plugin asks before it offers a GPU as dynamic MIG (a vGPU cannot be
// partitioned) and stops when the call fails.
//
//export nvmlDeviceGetVirtualizationMode
func nvmlDeviceGetVirtualizationMode(h C.uintptr_t, out *C.uint) C.int {
	return uintOf("nvmlDeviceGetVirtualizationMode", h, out, func(nvml.Device) (int, nvml.Return) {
		return int(nvml.GPU_VIRTUALIZATION_MODE_NONE), nvml.SUCCESS
	})
}

//export nvmlDeviceGetArchitecture
func nvmlDeviceGetArchitecture(h C.uintptr_t, out *C.uint) C.int {
	return uintOf("nvmlDeviceGetArchitecture", h, out, func(d nvml.Device) (int, nvml.Return) {
		a, ret := d.GetArchitecture()
		return int(a), ret
	})
}

//export nvmlDeviceGetComputeMode
func nvmlDeviceGetComputeMode(h C.uintptr_t, out *C.uint) C.int {
	return uintOf("nvmlDeviceGetComputeMode", h, out, func(d nvml.Device) (int, nvml.Return) {
		m, ret := d.GetComputeMode()
		return int(m), ret
	})
}

//export nvmlDeviceSetComputeMode
func nvmlDeviceSetComputeMode(h C.uintptr_t, mode C.uint) C.int {
	return onDevice("nvmlDeviceSetComputeMode", h, func(d nvml.Device) nvml.Return {
		return d.SetComputeMode(nvml.ComputeMode(mode))
	})
}

//export nvmlDeviceIsMigDeviceHandle
func nvmlDeviceIsMigDeviceHandle(h C.uintptr_t, out *C.uint) C.int {
	return uintOf("nvmlDeviceIsMigDeviceHandle", h, out, func(d nvml.Device) (int, nvml.Return) {
		m, ret := d.IsMigDeviceHandle()
		if m {
			return 1, ret
		}
		return 0, ret
	})
}

//export nvmlDeviceGetCudaComputeCapability
func nvmlDeviceGetCudaComputeCapability(h C.uintptr_t, major, minor *C.int) C.int {
	return onDevice("nvmlDeviceGetCudaComputeCapability", h, func(d nvml.Device) nvml.Return {
		ma, mi, ret := d.GetCudaComputeCapability()
		if ret == nvml.SUCCESS {
			*major, *minor = C.int(ma), C.int(mi)
		}
		return ret
	})
}

//export nvmlDeviceGetMemoryInfo
func nvmlDeviceGetMemoryInfo(h C.uintptr_t, out unsafe.Pointer) C.int {
	return onDevice("nvmlDeviceGetMemoryInfo", h, func(d nvml.Device) nvml.Return {
		m, ret := d.GetMemoryInfo()
		if ret == nvml.SUCCESS {
			*(*nvml.Memory)(out) = m
		}
		return ret
	})
}

//export nvmlDeviceGetMemoryInfo_v2
func nvmlDeviceGetMemoryInfo_v2(h C.uintptr_t, out unsafe.Pointer) C.int {
	return onDevice("nvmlDeviceGetMemoryInfo_v2", h, func(d nvml.Device) nvml.Return {
		m, ret := d.GetMemoryInfo_v2()
		if ret == nvml.SUCCESS {
			v2 := (*nvml.Memory_v2)(out)
			// The caller's version stays: it is an input.
			*v2 = nvml.Memory_v2{Version: v2.Version, Total: m.Total, Reserved: m.Reserved, Free: m.Free, Used: m.Used}
		}
		return ret
	})
}

//export nvmlDeviceGetAttributes_v2
func nvmlDeviceGetAttributes_v2(h C.uintptr_t, out unsafe.Pointer) C.int {
	return onDevice("nvmlDeviceGetAttributes_v2", h, func(d nvml.Device) nvml.Return {
		a, ret := d.GetAttributes()
		if ret == nvml.SUCCESS {
			*(*nvml.DeviceAttributes)(out) = a
		}
		return ret
	})
}

func pciInfo(name string, h C.uintptr_t, out unsafe.Pointer) C.int {
	return onDevice(name, h, func(d nvml.Device) nvml.Return {
		p, ret := d.GetPciInfo()
		if ret == nvml.SUCCESS {
			*(*nvml.PciInfo)(out) = p
		}
		return ret
	})
}

//export nvmlDeviceGetPciInfo_v3
func nvmlDeviceGetPciInfo_v3(h C.uintptr_t, out unsafe.Pointer) C.int {
	return pciInfo("nvmlDeviceGetPciInfo_v3", h, out)
}

//export nvmlDeviceGetPciInfo_v2
func nvmlDeviceGetPciInfo_v2(h C.uintptr_t, out unsafe.Pointer) C.int {
	return pciInfo("nvmlDeviceGetPciInfo_v2", h, out)
}

//export nvmlDeviceGetTemperature
func nvmlDeviceGetTemperature(h C.uintptr_t, sensor C.uint, out *C.uint) C.int {
	return uintOf("nvmlDeviceGetTemperature", h, out, func(d nvml.Device) (int, nvml.Return) {
		t, ret := d.GetTemperature(nvml.TemperatureSensors(sensor))
		return int(t), ret
	})
}

//export nvmlDeviceGetRemappedRows
func nvmlDeviceGetRemappedRows(h C.uintptr_t, corr, unc, pending, failed *C.uint) C.int {
	return onDevice("nvmlDeviceGetRemappedRows", h, func(d nvml.Device) nvml.Return {
		c, u, p, f, ret := d.GetRemappedRows()
		if ret == nvml.SUCCESS {
			*corr, *unc, *pending, *failed = C.uint(c), C.uint(u), cBool(p), cBool(f)
		}
		return ret
	})
}

func cBool(b bool) C.uint {
	if b {
		return 1
	}
	return 0
}

// runningProcesses answers the running-processes calls of every version:
// count in and out, NVML's size rules, and write to fill the caller's
// room of infos with ps (whose layout differs by version).
func runningProcesses(name string, h C.uintptr_t, count *C.uint, infos unsafe.Pointer, write func(room int, ps []nvml.ProcessInfo)) C.int {
	return onDevice(name, h, func(d nvml.Device) nvml.Return {
		ps, ret := d.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS {
			return ret
		}
		if count == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		room := int(*count)
		*count = C.uint(len(ps))
		if len(ps) == 0 {
			return nvml.SUCCESS
		}
		if infos == nil || room < len(ps) {
			return nvml.ERROR_INSUFFICIENT_SIZE
		}
		write(room, ps)
		return nvml.SUCCESS
	})
}

// processInfos writes nvmlProcessInfo_t (v2 and v3 of the calls):
// go-nvml's ProcessInfo has its layout.
func processInfos(infos unsafe.Pointer) func(int, []nvml.ProcessInfo) {
	return func(room int, ps []nvml.ProcessInfo) {
		copy(unsafe.Slice((*nvml.ProcessInfo)(infos), room), ps)
	}
}

//export nvmlDeviceGetComputeRunningProcesses_v3
func nvmlDeviceGetComputeRunningProcesses_v3(h C.uintptr_t, count *C.uint, infos unsafe.Pointer) C.int {
	return runningProcesses("nvmlDeviceGetComputeRunningProcesses_v3", h, count, infos, processInfos(infos))
}

//export nvmlDeviceGetComputeRunningProcesses_v2
func nvmlDeviceGetComputeRunningProcesses_v2(h C.uintptr_t, count *C.uint, infos unsafe.Pointer) C.int {
	return runningProcesses("nvmlDeviceGetComputeRunningProcesses_v2", h, count, infos, processInfos(infos))
}
