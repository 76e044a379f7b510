// Package checkpoint records which claims the plugin has prepared, so that
// unprepare (which gets only a claim's UID) and a restarted plugin know what
// to undo. Each claim is its own small file: preparing or unpreparing one
// claim costs the same however many others are prepared, and one damaged file
// loses one claim's record, not the node's.
package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpuaas/gpu-dra-driver/pkg/atomicfile"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/mps"
	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
)

// Version is the format of the files written today. Readers accept it and
// refuse (as damaged) anything else, so a downgrade never misreads a newer
// layout. The rule (docs/architecture.md, "The checkpoint"): a change that
// the previous release would read wrongly when it ignores the new fields
// (a field that changes what is held, or the meaning of an old one)
// increments Version, "v1" -> "v2"; an optional field whose absence
// means what older readers assume keeps it. A release reads every version
// it has ever written.
const Version = "v1"

const fileSuffix = ".json"

// tempPrefix names the temporary files of Save and Stage; one left behind was
// being written when its process died.
const tempPrefix = ".tmp-"

// State is how far preparing a claim got: a claim left in PrepareStarted was
// interrupted and is undone at start-up.
type State string

const (
	PrepareStarted   State = "PrepareStarted"
	PrepareCompleted State = "PrepareCompleted"
	// ReestablishStarted: the claim was prepared in an earlier boot of the
	// node, and what the reboot lost (MIG devices, sharing settings, CDI
	// spec) is being made again. One left in it was interrupted: what it
	// made is torn down and made again at the next start.
	ReestablishStarted State = "ReestablishStarted"
	// PrepareLost: what the claim was prepared with was lost in a node
	// reboot and could not be made again (Lost says why). The record holds
	// nothing on the node; preparing the claim fails, unpreparing it
	// deletes the record.
	PrepareLost State = "Lost"
)

// Device is one prepared device of a claim.
type Device struct {
	Requests     []string `json:"requests"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	GPUUUID      string   `json:"gpuUUID"`
	AdminAccess  bool     `json:"adminAccess,omitempty"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
	// GPUMode is the mode the GPU was offered in ("" whole, "static",
	// "dynamic", "timeSlicing/<replicas>", "shared"); a restart keeps it
	// until the claim is unprepared.
	GPUMode string `json:"gpuMode,omitempty"`
	// Shared marks a multi-allocatable device: other claims hold it too.
	Shared bool `json:"shared,omitempty"`
	// ShareID is the scheduler's ID of this claim's share of the device.
	ShareID string `json:"shareID,omitempty"`
	// Sharing are the GPU settings this device holds (time-slice interval,
	// MPS); unprepare releases them and the last holder resets the GPU.
	Sharing *timeslice.Settings `json:"sharing,omitempty"`
	// MIGIntent is the MIG device the plugin is about to create for this
	// claim (dynamic MIG), recorded before it creates it: when a prepare is
	// cut short before CreatedMIG is recorded, the undo destroys whatever
	// is at this placement on the GPU.
	MIGIntent *mig.Intent `json:"migIntent,omitempty"`
	// CreatedMIG is the MIG device the plugin created for this claim
	// (dynamic MIG); unprepare destroys exactly it.
	CreatedMIG *mig.Instance `json:"createdMIG,omitempty"`
	// MPSLimits are the client limits of an MPS device, kept so that its
	// CDI spec can be written again after a reboot.
	MPSLimits *mps.Limits `json:"mpsLimits,omitempty"`
	// DeviceClass is the DeviceClass of the device's request (the profile
	// the use metrics name, whose idle policy applies); "" in records
	// written before it was recorded.
	DeviceClass string `json:"deviceClass,omitempty"`
	// GPUShare is the part of its GPU the claim holds with the device (a
	// 1/4 replica 0.25, a MIG device its compute slices' share, a memory
	// share its memory's), by which its use is normalized to GPU units;
	// 0 (older records) is taken as 1.
	GPUShare float64 `json:"gpuShare,omitempty"`
	// MemoryLimitBytes is the memory the driver holds a replica's or a
	// share's container to (its size when prepared), kept so that its CDI
	// spec can be written again after a reboot; 0 for none.
	MemoryLimitBytes int64 `json:"memoryLimitBytes,omitempty"`
}

// Pod is a pod the claim was reserved for when it was prepared.
type Pod struct {
	UID  string `json:"uid"`
	Name string `json:"name"`
}

// Claim is the record of one prepared claim.
type Claim struct {
	UID       string   `json:"uid"`
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	State     State    `json:"state"`
	Devices   []Device `json:"devices"`
	// BootID is the node's boot (Linux boot_id) in which the record's MIG
	// devices, sharing settings and CDI spec were made; none of them
	// outlives a reboot. Empty: not known (written before boot IDs were
	// recorded, or none could be read), taken as the current boot.
	BootID string `json:"bootID,omitempty"`
	// Lost says why a PrepareLost claim could not be set up again.
	Lost string `json:"lost,omitempty"`
	// Pods are the pods the claim was reserved for (status.reservedFor)
	// when it was prepared: a restarted plugin maps the processes on a
	// shared GPU to the claim through them. Optional: an older record
	// without them maps none until the kubelet prepares the claim again
	// or its pods are read from the API.
	Pods []Pod `json:"pods,omitempty"`
}

// file is the on-disk envelope. The checksum covers the exact bytes of the
// claim as written, not a re-encoding, so adding a field in a later version
// never makes an old file look damaged.
type file struct {
	Version  string          `json:"version"`
	Checksum string          `json:"checksum"`
	Claim    json.RawMessage `json:"claim"`
}

// ErrDamaged marks a file that cannot be trusted: unreadable JSON, unknown
// version, or a checksum mismatch.
var ErrDamaged = errors.New("damaged checkpoint")

// ErrNewerFormat marks a file of a later format than this plugin reads:
// written by a newer release, found after a rollback. It is also
// ErrDamaged (the record is set aside and rebuilt from the claim, never
// misread); its message names both formats.
var ErrNewerFormat = errors.New("checkpoint written by a newer release")

// Store keeps one file per claim in a directory.
type Store struct {
	dir string
}

// NewStore creates the directory if needed.
func NewStore(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("creating checkpoint directory: %w", err)
	}
	return &Store{dir: dir}, nil
}

// Dir is the directory of the records.
func (s *Store) Dir() string { return s.dir }

// Path is where the record of a claim lives.
func (s *Store) Path(uid string) string { return filepath.Join(s.dir, uid+fileSuffix) }

// Save writes the claim's record atomically and durably: a crash, even a
// power loss, leaves either the old record or the new one, never a torn
// file. It is for the states the node must find again after a reboot: a
// claim the kubelet was told is prepared (PrepareCompleted) must be set up
// again (reboot.go), and one that lost its devices (PrepareLost) must keep
// failing.
func (s *Store) Save(c *Claim) error {
	return s.write(c, atomicfile.Write)
}

// Stage writes the claim's record atomically but not durably: the record
// of a prepare under way (PrepareStarted, the MIG device about to be made
// or just made). A process crash keeps it (it is in the page cache), so the
// restarted plugin undoes what the prepare made. A power loss may lose it,
// but takes with it everything it describes: MIG devices, compute modes
// and a CDI root on tmpfs are gone after a reboot, and a CDI spec left on
// disk without a record is deleted at start. It saves the two fsyncs of a
// durable write on each intermediate state, which were most of a prepare's
// cost.
func (s *Store) Stage(c *Claim) error {
	return s.write(c, atomicfile.Replace)
}

func (s *Store) write(c *Claim, write func(string, []byte, os.FileMode, string) error) error {
	data, err := encode(c)
	if err != nil {
		return err
	}
	if err := write(s.Path(c.UID), data, 0o600, tempPrefix+c.UID+fileSuffix+"-*"); err != nil {
		return fmt.Errorf("saving checkpoint of claim %s: %w", c.UID, err)
	}
	return nil
}

// Delete removes a claim's record durably (a missing record is not an
// error): a record that a power loss brought back would make the plugin set
// up, after the reboot, a claim the kubelet has already unprepared, and
// leak what it makes for it.
func (s *Store) Delete(uid string) error {
	if err := atomicfile.Remove(s.Path(uid)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("deleting checkpoint of claim %s: %w", uid, err)
	}
	return nil
}

// Damaged is a record that could not be read; its claim UID comes from the
// file name, so the claim can still be rebuilt or cleaned up.
type Damaged struct {
	UID string
	Err error
}

// Suffixes of records set aside: damagedSuffix once its claim was checked
// against the API (rebuilt, or found gone), uncheckedSuffix while it could
// not be (the API was unreachable at that start).
const (
	damagedSuffix   = ".damaged"
	uncheckedSuffix = ".unchecked"
)

// LoadAll reads every record. Damaged ones are moved aside (kept for
// inspection as <uid>.json.damaged) and returned separately; they never stop
// the plugin. So are the records set aside unchecked at an earlier start
// (Unchecked) that no record has replaced since: their claims are still to
// be checked, and rebuilt if they run here.
func (s *Store) LoadAll() ([]*Claim, []Damaged, error) {
	claims, damaged, err := s.List()
	if err != nil {
		return nil, nil, err
	}
	for _, d := range damaged {
		_ = os.Rename(s.Path(d.UID), s.Path(d.UID)+damagedSuffix)
	}
	unchecked, err := s.unchecked()
	if err != nil {
		return nil, nil, err
	}
	for _, d := range unchecked {
		_ = os.Rename(s.Path(d.UID)+uncheckedSuffix, s.Path(d.UID)+damagedSuffix)
	}
	return claims, append(damaged, unchecked...), nil
}

// unchecked are the records set aside unchecked whose claim has no record
// now (one rebuilt by the kubelet's prepare replaces it).
func (s *Store) unchecked() ([]Damaged, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("reading checkpoint directory: %w", err)
	}
	var out []Damaged
	for _, e := range entries {
		uid, ok := strings.CutSuffix(e.Name(), fileSuffix+uncheckedSuffix)
		if !ok || e.IsDir() {
			continue
		}
		if _, err := os.Stat(s.Path(uid)); err == nil {
			_ = os.Rename(s.Path(uid)+uncheckedSuffix, s.Path(uid)+damagedSuffix)
			continue
		}
		out = append(out, Damaged{UID: uid, Err: fmt.Errorf("%w: set aside at an earlier start, when its claim could not be checked against the API", ErrDamaged)})
	}
	return out, nil
}

// Unchecked marks a record LoadAll set aside as not yet checked against
// the API, so that the next LoadAll returns it again.
func (s *Store) Unchecked(uid string) error {
	if err := os.Rename(s.Path(uid)+damagedSuffix, s.Path(uid)+uncheckedSuffix); err != nil {
		return fmt.Errorf("marking the damaged record of claim %s unchecked: %w", uid, err)
	}
	return nil
}

// List reads every record and changes nothing, so it is safe while another
// process (the other plugin instance of a rolling update) writes records: a
// record deleted meanwhile is skipped, not reported as damaged.
func (s *Store) List() ([]*Claim, []Damaged, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("reading checkpoint directory: %w", err)
	}
	var claims []*Claim
	var damaged []Damaged
	for _, e := range entries {
		uid, ok := strings.CutSuffix(e.Name(), fileSuffix)
		if !ok || e.IsDir() {
			continue
		}
		c, err := s.Load(uid)
		switch {
		case err != nil:
			damaged = append(damaged, Damaged{UID: uid, Err: err})
		case c != nil:
			claims = append(claims, c)
		}
	}
	return claims, damaged, nil
}

// Load reads one claim's record: (nil, nil) when the claim has none.
func (s *Store) Load(uid string) (*Claim, error) {
	c, err := s.load(uid)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return c, err
}

// RemoveTemp deletes temporary files that writes interrupted by a crash
// left behind. The caller makes sure no write is under way (the plugin
// holds every GPU's lock).
func (s *Store) RemoveTemp() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("reading checkpoint directory: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), tempPrefix) {
			continue
		}
		if err := os.Remove(filepath.Join(s.dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing temporary checkpoint file: %w", err))
		}
	}
	return errors.Join(errs...)
}

func (s *Store) load(uid string) (*Claim, error) {
	data, err := os.ReadFile(s.Path(uid))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDamaged, err)
	}
	c, err := decode(data)
	if err != nil {
		return nil, err
	}
	if c.UID != uid {
		return nil, fmt.Errorf("%w: file of claim %s holds claim %s", ErrDamaged, uid, c.UID)
	}
	return c, nil
}

func encode(c *Claim) ([]byte, error) {
	claim, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encoding checkpoint of claim %s: %w", c.UID, err)
	}
	return json.Marshal(file{Version: Version, Checksum: checksum(claim), Claim: claim})
}

func decode(data []byte) (*Claim, error) {
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDamaged, err)
	}
	if f.Version != Version {
		if formatNumber(f.Version) > formatNumber(Version) {
			return nil, fmt.Errorf("%w (%w): format %q, this plugin reads %q; after a rollback, records of the newer release are rebuilt from their claims",
				ErrDamaged, ErrNewerFormat, f.Version, Version)
		}
		return nil, fmt.Errorf("%w: unknown version %q", ErrDamaged, f.Version)
	}
	if got := checksum(f.Claim); got != f.Checksum {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrDamaged)
	}
	var c Claim
	if err := json.Unmarshal(f.Claim, &c); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrDamaged, err)
	}
	return &c, nil
}

// formatNumber is N of a version "vN", or 0 when it is not of that form.
func formatNumber(v string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(v, "v"))
	if err != nil || !strings.HasPrefix(v, "v") || n < 0 {
		return 0
	}
	return n
}

func checksum(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
