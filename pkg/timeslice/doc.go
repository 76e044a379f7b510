// Package timeslice offers a GPU to several claims at once: time-slice
// replicas (N devices per GPU) and memory shares (one multi-allocatable
// device, KEP-5075), and the per-GPU sharing settings applied while claims
// hold them (time-slice interval, MPS), reference counted so the last claim
// on a GPU resets them.
package timeslice
