package main

/*
#include <stdint.h>
*/
import "C"

import (
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Mirrors of NVML's structs that hold handles: the handle fields are
// plain integers here (a handle is C memory, handles.of), so writing them
// never involves this runtime's pointer bookkeeping.
type (
	// cGpuInstanceInfo is nvmlGpuInstanceInfo_t.
	cGpuInstanceInfo struct {
		Device    uintptr
		ID        uint32
		ProfileID uint32
		Placement nvml.GpuInstancePlacement
	}
	// cComputeInstanceInfo is nvmlComputeInstanceInfo_t.
	cComputeInstanceInfo struct {
		Device      uintptr
		GpuInstance uintptr
		ID          uint32
		ProfileID   uint32
		Placement   nvml.ComputeInstancePlacement
	}
	// cEventData is nvmlEventData_t.
	cEventData struct {
		Device            uintptr
		EventType         uint64
		EventData         uint64
		GpuInstanceID     uint32
		ComputeInstanceID uint32
	}
)

//export nvmlDeviceGetMigMode
func nvmlDeviceGetMigMode(h C.uintptr_t, current, pending *C.uint) C.int {
	return onDevice("nvmlDeviceGetMigMode", h, func(d nvml.Device) nvml.Return {
		c, p, ret := d.GetMigMode()
		if ret == nvml.SUCCESS {
			*current, *pending = C.uint(c), C.uint(p)
		}
		return ret
	})
}

//export nvmlDeviceSetMigMode
func nvmlDeviceSetMigMode(h C.uintptr_t, mode C.uint, activation *C.int) C.int {
	return onDevice("nvmlDeviceSetMigMode", h, func(d nvml.Device) nvml.Return {
		act, ret := d.SetMigMode(int(mode))
		if activation != nil {
			*activation = C.int(act)
		}
		return ret
	})
}

//export nvmlDeviceGetMigDeviceHandleByIndex
func nvmlDeviceGetMigDeviceHandleByIndex(h C.uintptr_t, i C.uint, out *C.uintptr_t) C.int {
	return onDevice("nvmlDeviceGetMigDeviceHandleByIndex", h, func(d nvml.Device) nvml.Return {
		m, ret := d.GetMigDeviceHandleByIndex(int(i))
		return putDevice(out, m, ret)
	})
}

//export nvmlDeviceGetDeviceHandleFromMigDeviceHandle
func nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h C.uintptr_t, out *C.uintptr_t) C.int {
	return onDevice("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", h, func(d nvml.Device) nvml.Return {
		p, ret := d.GetDeviceHandleFromMigDeviceHandle()
		return putDevice(out, p, ret)
	})
}

//export nvmlDeviceGetGpuInstanceProfileInfo
func nvmlDeviceGetGpuInstanceProfileInfo(h C.uintptr_t, profile C.uint, out unsafe.Pointer) C.int {
	return onDevice("nvmlDeviceGetGpuInstanceProfileInfo", h, func(d nvml.Device) nvml.Return {
		info, ret := d.GetGpuInstanceProfileInfo(int(profile))
		if ret == nvml.SUCCESS {
			*(*nvml.GpuInstanceProfileInfo)(out) = info
		}
		return ret
	})
}

// giProfile is the profile info a call that names a GPU instance profile
// by ID needs for go-nvml's interface.
func giProfile(d nvml.Device, profile C.uint) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	return d.GetGpuInstanceProfileInfo(int(profile))
}

func placements(name string, h C.uintptr_t, profile C.uint, out unsafe.Pointer, count *C.uint) C.int {
	return onDevice(name, h, func(d nvml.Device) nvml.Return {
		info, ret := giProfile(d, profile)
		if ret != nvml.SUCCESS {
			return ret
		}
		pls, ret := d.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			return ret
		}
		if count == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if out == nil {
			*count = C.uint(len(pls))
			return nvml.SUCCESS
		}
		if int(*count) < len(pls) {
			*count = C.uint(len(pls))
			return nvml.ERROR_INSUFFICIENT_SIZE
		}
		copy(unsafe.Slice((*nvml.GpuInstancePlacement)(out), len(pls)), pls)
		*count = C.uint(len(pls))
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetGpuInstancePossiblePlacements_v2
func nvmlDeviceGetGpuInstancePossiblePlacements_v2(h C.uintptr_t, profile C.uint, out unsafe.Pointer, count *C.uint) C.int {
	return placements("nvmlDeviceGetGpuInstancePossiblePlacements_v2", h, profile, out, count)
}

//export nvmlDeviceGetGpuInstancePossiblePlacements
func nvmlDeviceGetGpuInstancePossiblePlacements(h C.uintptr_t, profile C.uint, out unsafe.Pointer, count *C.uint) C.int {
	return placements("nvmlDeviceGetGpuInstancePossiblePlacements", h, profile, out, count)
}

//export nvmlDeviceGetGpuInstanceRemainingCapacity
func nvmlDeviceGetGpuInstanceRemainingCapacity(h C.uintptr_t, profile C.uint, out *C.uint) C.int {
	return onDevice("nvmlDeviceGetGpuInstanceRemainingCapacity", h, func(d nvml.Device) nvml.Return {
		info, ret := giProfile(d, profile)
		if ret != nvml.SUCCESS {
			return ret
		}
		n, ret := d.GetGpuInstanceRemainingCapacity(&info)
		if ret == nvml.SUCCESS {
			*out = C.uint(n)
		}
		return ret
	})
}

func putGI(out *C.uintptr_t, gi nvml.GpuInstance, ret nvml.Return) nvml.Return {
	if ret != nvml.SUCCESS {
		return ret
	}
	*out = handles.of(gi)
	return nvml.SUCCESS
}

//export nvmlDeviceCreateGpuInstance
func nvmlDeviceCreateGpuInstance(h C.uintptr_t, profile C.uint, out *C.uintptr_t) C.int {
	return onDevice("nvmlDeviceCreateGpuInstance", h, func(d nvml.Device) nvml.Return {
		info, ret := giProfile(d, profile)
		if ret != nvml.SUCCESS {
			return ret
		}
		gi, ret := d.CreateGpuInstance(&info)
		return putGI(out, gi, ret)
	})
}

//export nvmlDeviceCreateGpuInstanceWithPlacement
func nvmlDeviceCreateGpuInstanceWithPlacement(h C.uintptr_t, profile C.uint, placement unsafe.Pointer, out *C.uintptr_t) C.int {
	return onDevice("nvmlDeviceCreateGpuInstanceWithPlacement", h, func(d nvml.Device) nvml.Return {
		if placement == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		info, ret := giProfile(d, profile)
		if ret != nvml.SUCCESS {
			return ret
		}
		pl := *(*nvml.GpuInstancePlacement)(placement)
		gi, ret := d.CreateGpuInstanceWithPlacement(&info, &pl)
		return putGI(out, gi, ret)
	})
}

//export nvmlDeviceGetGpuInstances
func nvmlDeviceGetGpuInstances(h C.uintptr_t, profile C.uint, out *C.uintptr_t, count *C.uint) C.int {
	return onDevice("nvmlDeviceGetGpuInstances", h, func(d nvml.Device) nvml.Return {
		info, ret := giProfile(d, profile)
		if ret != nvml.SUCCESS {
			return ret
		}
		gis, ret := d.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			return ret
		}
		return putHandles(out, count, gis)
	})
}

// putHandles writes the handles of objs into a caller's array of *count
// (at least the profile's instance count, as NVML requires).
func putHandles[T any](out *C.uintptr_t, count *C.uint, objs []T) nvml.Return {
	if count == nil || (out == nil && len(objs) > 0) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if len(objs) > int(*count) {
		*count = C.uint(len(objs))
		return nvml.ERROR_INSUFFICIENT_SIZE
	}
	if len(objs) > 0 {
		hs := unsafe.Slice(out, len(objs))
		for i, o := range objs {
			hs[i] = handles.of(o)
		}
	}
	*count = C.uint(len(objs))
	return nvml.SUCCESS
}

//export nvmlDeviceGetGpuInstanceById
func nvmlDeviceGetGpuInstanceById(h C.uintptr_t, id C.uint, out *C.uintptr_t) C.int {
	return onDevice("nvmlDeviceGetGpuInstanceById", h, func(d nvml.Device) nvml.Return {
		gi, ret := d.GetGpuInstanceById(int(id))
		return putGI(out, gi, ret)
	})
}

func onGI(name string, h C.uintptr_t, f func(gi nvml.GpuInstance) nvml.Return) C.int {
	return call(name, func(nvml.Interface) nvml.Return {
		gi, ret := gpuInstance(h)
		if ret != nvml.SUCCESS {
			return ret
		}
		return f(gi)
	})
}

//export nvmlGpuInstanceGetInfo
func nvmlGpuInstanceGetInfo(h C.uintptr_t, out unsafe.Pointer) C.int {
	return onGI("nvmlGpuInstanceGetInfo", h, func(gi nvml.GpuInstance) nvml.Return {
		info, ret := gi.GetInfo()
		if ret != nvml.SUCCESS {
			return ret
		}
		*(*cGpuInstanceInfo)(out) = cGpuInstanceInfo{Device: uintptr(handles.of(info.Device)), ID: info.Id,
			ProfileID: info.ProfileId, Placement: info.Placement}
		return nvml.SUCCESS
	})
}

//export nvmlGpuInstanceDestroy
func nvmlGpuInstanceDestroy(h C.uintptr_t) C.int {
	return onGI("nvmlGpuInstanceDestroy", h, nvml.GpuInstance.Destroy)
}

//export nvmlGpuInstanceGetComputeInstanceProfileInfo
func nvmlGpuInstanceGetComputeInstanceProfileInfo(h C.uintptr_t, profile, engProfile C.uint, out unsafe.Pointer) C.int {
	return onGI("nvmlGpuInstanceGetComputeInstanceProfileInfo", h, func(gi nvml.GpuInstance) nvml.Return {
		info, ret := gi.GetComputeInstanceProfileInfo(int(profile), int(engProfile))
		if ret == nvml.SUCCESS {
			*(*nvml.ComputeInstanceProfileInfo)(out) = info
		}
		return ret
	})
}

// ciProfile is the shared-engine profile info of a compute instance
// profile named by ID (NVML's calls that take only the ID mean that one).
func ciProfile(gi nvml.GpuInstance, profile C.uint) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
	return gi.GetComputeInstanceProfileInfo(int(profile), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
}

func putCI(out *C.uintptr_t, ci nvml.ComputeInstance, ret nvml.Return) nvml.Return {
	if ret != nvml.SUCCESS {
		return ret
	}
	*out = handles.of(ci)
	return nvml.SUCCESS
}

//export nvmlGpuInstanceCreateComputeInstance
func nvmlGpuInstanceCreateComputeInstance(h C.uintptr_t, profile C.uint, out *C.uintptr_t) C.int {
	return onGI("nvmlGpuInstanceCreateComputeInstance", h, func(gi nvml.GpuInstance) nvml.Return {
		info, ret := ciProfile(gi, profile)
		if ret != nvml.SUCCESS {
			return ret
		}
		ci, ret := gi.CreateComputeInstance(&info)
		return putCI(out, ci, ret)
	})
}

//export nvmlGpuInstanceGetComputeInstances
func nvmlGpuInstanceGetComputeInstances(h C.uintptr_t, profile C.uint, out *C.uintptr_t, count *C.uint) C.int {
	return onGI("nvmlGpuInstanceGetComputeInstances", h, func(gi nvml.GpuInstance) nvml.Return {
		info, ret := ciProfile(gi, profile)
		if ret != nvml.SUCCESS {
			return ret
		}
		cis, ret := gi.GetComputeInstances(&info)
		if ret != nvml.SUCCESS {
			return ret
		}
		return putHandles(out, count, cis)
	})
}

//export nvmlGpuInstanceGetComputeInstanceById
func nvmlGpuInstanceGetComputeInstanceById(h C.uintptr_t, id C.uint, out *C.uintptr_t) C.int {
	return onGI("nvmlGpuInstanceGetComputeInstanceById", h, func(gi nvml.GpuInstance) nvml.Return {
		ci, ret := gi.GetComputeInstanceById(int(id))
		return putCI(out, ci, ret)
	})
}

//export nvmlGpuInstanceGetComputeInstanceRemainingCapacity
func nvmlGpuInstanceGetComputeInstanceRemainingCapacity(h C.uintptr_t, profile C.uint, out *C.uint) C.int {
	return onGI("nvmlGpuInstanceGetComputeInstanceRemainingCapacity", h, func(gi nvml.GpuInstance) nvml.Return {
		info, ret := ciProfile(gi, profile)
		if ret != nvml.SUCCESS {
			return ret
		}
		n, ret := gi.GetComputeInstanceRemainingCapacity(&info)
		if ret == nvml.SUCCESS {
			*out = C.uint(n)
		}
		return ret
	})
}

func onCI(name string, h C.uintptr_t, f func(ci nvml.ComputeInstance) nvml.Return) C.int {
	return call(name, func(nvml.Interface) nvml.Return {
		ci, ret := computeInstance(h)
		if ret != nvml.SUCCESS {
			return ret
		}
		return f(ci)
	})
}

func ciInfo(name string, h C.uintptr_t, out unsafe.Pointer) C.int {
	return onCI(name, h, func(ci nvml.ComputeInstance) nvml.Return {
		info, ret := ci.GetInfo()
		if ret != nvml.SUCCESS {
			return ret
		}
		*(*cComputeInstanceInfo)(out) = cComputeInstanceInfo{Device: uintptr(handles.of(info.Device)),
			GpuInstance: uintptr(handles.of(info.GpuInstance)), ID: info.Id, ProfileID: info.ProfileId,
			Placement: info.Placement}
		return nvml.SUCCESS
	})
}

//export nvmlComputeInstanceGetInfo_v2
func nvmlComputeInstanceGetInfo_v2(h C.uintptr_t, out unsafe.Pointer) C.int {
	return ciInfo("nvmlComputeInstanceGetInfo_v2", h, out)
}

//export nvmlComputeInstanceDestroy
func nvmlComputeInstanceDestroy(h C.uintptr_t) C.int {
	return onCI("nvmlComputeInstanceDestroy", h, nvml.ComputeInstance.Destroy)
}

//export nvmlEventSetCreate
func nvmlEventSetCreate(out *C.uintptr_t) C.int {
	return call("nvmlEventSetCreate", func(lib nvml.Interface) nvml.Return {
		es, ret := lib.EventSetCreate()
		if ret != nvml.SUCCESS {
			return ret
		}
		*out = handles.of(es)
		return nvml.SUCCESS
	})
}

//export nvmlDeviceGetSupportedEventTypes
func nvmlDeviceGetSupportedEventTypes(h C.uintptr_t, out *C.ulonglong) C.int {
	return onDevice("nvmlDeviceGetSupportedEventTypes", h, func(d nvml.Device) nvml.Return {
		t, ret := d.GetSupportedEventTypes()
		if ret == nvml.SUCCESS {
			*out = C.ulonglong(t)
		}
		return ret
	})
}

//export nvmlDeviceRegisterEvents
func nvmlDeviceRegisterEvents(h C.uintptr_t, types C.ulonglong, set C.uintptr_t) C.int {
	return onDevice("nvmlDeviceRegisterEvents", h, func(d nvml.Device) nvml.Return {
		es, ret := eventSet(set)
		if ret != nvml.SUCCESS {
			return ret
		}
		return d.RegisterEvents(uint64(types), es)
	})
}

func eventWait(name string, set C.uintptr_t, out unsafe.Pointer, timeoutMs C.uint) C.int {
	return call(name, func(nvml.Interface) nvml.Return {
		es, ret := eventSet(set)
		if ret != nvml.SUCCESS {
			return ret
		}
		data, ret := es.Wait(uint32(timeoutMs))
		if ret != nvml.SUCCESS {
			return ret
		}
		ev := cEventData{EventType: data.EventType, EventData: data.EventData,
			GpuInstanceID: data.GpuInstanceId, ComputeInstanceID: data.ComputeInstanceId}
		if data.Device != nil {
			ev.Device = uintptr(handles.of(data.Device))
		}
		*(*cEventData)(out) = ev
		return nvml.SUCCESS
	})
}

//export nvmlEventSetWait_v2
func nvmlEventSetWait_v2(set C.uintptr_t, out unsafe.Pointer, timeoutMs C.uint) C.int {
	return eventWait("nvmlEventSetWait_v2", set, out, timeoutMs)
}

//export nvmlEventSetFree
func nvmlEventSetFree(set C.uintptr_t) C.int {
	return call("nvmlEventSetFree", func(nvml.Interface) nvml.Return {
		es, ret := eventSet(set)
		if ret != nvml.SUCCESS {
			return ret
		}
		return es.Free()
	})
}
