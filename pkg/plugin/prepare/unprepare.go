package prepare

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// Unprepare undoes Prepare. Unpreparing an unknown claim is not an error:
// the kubelet retries, and the claim may have been cleaned up at start-up.
func (s *State) Unprepare(ctx context.Context, uid types.UID) (err error) {
	start := time.Now()
	defer func() { s.metrics.Observe("unprepare", time.Since(start).Seconds(), err) }()
	gpus, err := s.claimGPUs(uid)
	if err != nil || gpus == nil {
		return err
	}
	held, err := s.lockFresh(ctx, lockHolder(uid), gpus)
	if err != nil {
		return err
	}
	defer held.unlock()
	rec, err := s.env.Store.Load(string(uid))
	if err != nil || rec == nil {
		return err // never prepared, rolled back, or unprepared already
	}
	if !slices.Equal(held.uuids, sortedGPUs(recordGPUs(rec))) {
		return fmt.Errorf("claim %s: record names GPUs %v, not the %v its prepare held", uid, recordGPUs(rec), held.uuids)
	}
	if err := held.stamp(); err != nil {
		return err
	}
	// What is torn down must be finished even if the kubelet gives up.
	if err := s.undo(context.WithoutCancel(ctx), rec); err != nil {
		return err
	}
	klog.FromContext(ctx).V(2).Info("Unprepared claim", "claim", klog.KRef(rec.Namespace, rec.Name), "claimUID", uid)
	return nil
}

// claimGPUs are the GPUs whose locks cover a claim: those its record names
// or, while its prepare is in flight in this process and has written no
// record yet, those the prepare holds, so that Unprepare waits for the
// prepare and then undoes it. Nil: the claim is not prepared.
func (s *State) claimGPUs(uid types.UID) ([]string, error) {
	rec, err := s.env.Store.Load(string(uid))
	if err != nil {
		return nil, fmt.Errorf("reading record of claim %s: %w", uid, err)
	}
	if rec != nil {
		return recordGPUs(rec), nil
	}
	return s.inflight.gpus(uid), nil
}

// undo removes what prepare made, then forgets the claim. The record goes
// last, so a failure half-way is retried from the record.
func (s *State) undo(ctx context.Context, rec *checkpoint.Claim) error {
	if err := s.tearDown(ctx, rec); err != nil {
		return err
	}
	if err := s.cdi.DeleteClaimSpec(rec.UID); err != nil {
		return fmt.Errorf("deleting CDI spec: %w", err)
	}
	if err := s.env.Store.Delete(rec.UID); err != nil {
		return err
	}
	s.index.remove(rec)
	s.metrics.SetPreparedClaims(s.index.list())
	return nil
}

// tearDown undoes what prepare set up for a claim, device by device, as
// each device's kind recorded it; every device is tried.
func (s *State) tearDown(ctx context.Context, rec *checkpoint.Claim) error {
	var errs []error
	for i := range rec.Devices {
		errs = append(errs, device.RecordedKind(&rec.Devices[i]).TearDown(ctx, &s.env, rec, i))
	}
	return errors.Join(errs...)
}

// adoptRecord counts again what a recorded claim holds (after a restart,
// or after another process changed it) on the GPUs for which on is true.
func (s *State) adoptRecord(rec *checkpoint.Claim, on func(gpu string) bool) error {
	var errs []error
	for i := range rec.Devices {
		if d := &rec.Devices[i]; on(d.GPUUUID) {
			errs = append(errs, device.RecordedKind(d).Adopt(&s.env, rec.UID, d))
		}
	}
	return errors.Join(errs...)
}

func allGPUs(string) bool { return true }
