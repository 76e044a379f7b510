// Command mocknvml acts on the persistent mock machines that
// dra-kubelet-plugin --nvml=mock:<machine> --mock-nvml-state-dir=DIR keeps
// in DIR, from outside the plugin, as a node's owner acts on real GPUs, or
// as a real GPU fails.
//
//	mocknvml reboot --state-dir DIR [--boot-id-path FILE]
//	mocknvml xid --state-dir DIR --gpu N|UUID --code C [--gi ID] [--ci ID]
//	mocknvml ecc --state-dir DIR --gpu N|UUID
//	mocknvml lost --state-dir DIR --gpu N|UUID
//	mocknvml recover --state-dir DIR --gpu N|UUID
//	mocknvml mig-destroy-fails --state-dir DIR --gpu N|UUID [--off]
//	mocknvml clear --state-dir DIR
//	mocknvml mig-layout --state-dir DIR --gpu N --profiles P[,P...] [--machine M --seed NODE]
//	mocknvml row-remap --state-dir DIR --gpu N|UUID [--off]
//	mocknvml unknown-generation --state-dir DIR --gpu N|UUID [--off]
//	mocknvml slow-create --state-dir DIR --delay D
//	mocknvml driver-unload --state-dir DIR
//	mocknvml driver-load --state-dir DIR
//	mocknvml mig-mode-in-use --state-dir DIR --gpu N|UUID --times K
//	mocknvml hold --state-dir DIR --gpu N|UUID --pid P [--name NAME] [--off]
//	mocknvml mig-mode-pending --state-dir DIR --gpu N|UUID [--off]
//	mocknvml rebind-on-mig-mode --state-dir DIR --gpu N|UUID [--off]
//	mocknvml rebind --state-dir DIR --gpu N|UUID
//	mocknvml reset --state-dir DIR --gpu N|UUID
//	mocknvml use --state-dir DIR (--gpu N|UUID [--mem P] | --mig UUID) [--sm P] [--mem-used SIZE]
//	mocknvml use-unsupported --state-dir DIR --gpu N|UUID [--off]
//	mocknvml proc --state-dir DIR (--gpu N|UUID | --mig UUID) --pid P [--name NAME] [--sm P] [--mem P] [--mem-used SIZE]
//	mocknvml proc --state-dir DIR --pid P --end
//
// reboot simulates a node reboot: MIG devices and compute modes are lost
// (MIG mode too, except on Ampere) and FILE, the plugin's --boot-id-path,
// gets a new boot ID, which it prints. Stop the plugin first, as a reboot
// would, and start it again after.
//
// The others inject faults, which running plugins see at their next NVML
// call (events within their next event wait); a GPU is named by index or
// UUID. xid reports XID C on the GPU, or on the MIG device of GPU instance
// --gi and compute instance --ci; ecc reports a double-bit ECC error. lost
// makes the GPU fall off the bus (its probes fail, NVML hands out no new
// handle of it, so a plugin started after enumerates it as lost, and XID
// 79 is reported), recover brings it back. mig-destroy-fails makes destroying
// the GPU's MIG instances fail as if a process still used them, until
// --off. row-remap makes the GPU report a row remapping pending (what an
// uncorrectable memory error leaves for the next reset), until --off.
// unknown-generation makes the GPU answer a brand and an architecture newer
// than go-nvlib knows (a new product on a newer driver), until --off. clear
// ends every standing fault of every GPU (those above and the MIG mode
// faults below).
// slow-create makes creating a GPU instance take D (e.g. 1s, as on a real
// GPU; 0 for at once) on every GPU, so that restores take as long as on a
// real node.
//
// MIG mode changes fail as on real GPUs (issue 25 item 2): mig-mode-in-use
// makes the GPU's next K changes answer ERROR_IN_USE (0: none); hold makes
// process P (named NAME, e.g. dcgm-exporter) use the GPU until --off, so
// that every change answers ERROR_IN_USE and NVML lists P on the GPU;
// mig-mode-pending leaves changes pending until a reset (activation status
// RESET_REQUIRED), until --off; rebind-on-mig-mode gives the GPU a new
// minor number at each change that takes effect, until --off. A re-bind
// also makes the handles processes obtained before it answer GPU_IS_LOST
// until they look the GPU up again, and their event registrations deaf to
// it until they register again. rebind re-binds the GPU now, without a
// mode change, as mig-manager does to a static-MIG GPU. reset
// resets the GPU as nvidia-smi -r does: a pending MIG mode becomes current,
// MIG devices and the compute mode are lost; it refuses while a process
// holds the GPU.
//
// use, use-unsupported and proc set what the GPUs are doing, which NVML's
// use calls answer (utilization, memory, processes, GPM; see
// docs/simulated-nvml.md): use sets a GPU's SM utilization --sm and memory
// utilization --mem (percents) and memory used --mem-used (a size: 1Gi,
// 512Mi, bytes), or a MIG device's SM activity (GPM) and memory used;
// what is not given is 0. use-unsupported makes the GPU's use calls, and
// its MIG devices', answer NOT_SUPPORTED (a GPU or driver without them),
// until --off (clear ends it too). proc runs process P on a GPU or MIG
// device, using --sm and --mem of the GPU's time and --mem-used of its
// memory, or changes what it does there; --end ends it on every device:
// NVML lists it no more. A GPU reports at least what its processes add up
// to.
//
// mig-layout does what an admin does with mig-parted before offering a GPU
// as static MIG: it enables MIG mode on GPU N and makes a MIG device of each
// profile (e.g. 3g.40gb,2g.20gb,1g.10gb), at placements where they all fit
// beside the MIG devices already there (mig.ApplyLayout). On a
// state directory no plugin has used yet, --machine and --seed (the
// plugin's --nvml=mock:<machine> and its node name) create the machine.
//
// driver-unload unloads the mock machines' driver module, as rmmod nvidia
// does: it fails, naming them, while processes hold NVML sessions (a
// plugin that has not released the GPUs: dra-kubelet-plugin
// --release-gpus); while unloaded, opening NVML fails with "Driver Not
// Loaded". driver-load loads it again. A driver upgrade between the two
// is a new libnvidia-ml.so.<version> under the plugin's driver root.
//
// --state-dir defaults to $MOCK_NVML_STATE_DIR.
package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

const usage = `usage:
  mocknvml reboot --state-dir DIR [--boot-id-path FILE]
  mocknvml xid --state-dir DIR --gpu N|UUID --code C [--gi ID] [--ci ID]
  mocknvml ecc --state-dir DIR --gpu N|UUID
  mocknvml lost --state-dir DIR --gpu N|UUID
  mocknvml recover --state-dir DIR --gpu N|UUID
  mocknvml mig-destroy-fails --state-dir DIR --gpu N|UUID [--off]
  mocknvml clear --state-dir DIR
  mocknvml mig-layout --state-dir DIR --gpu N --profiles P[,P...] [--machine M --seed NODE]
  mocknvml row-remap --state-dir DIR --gpu N|UUID [--off]
  mocknvml unknown-generation --state-dir DIR --gpu N|UUID [--off]
  mocknvml slow-create --state-dir DIR --delay D
  mocknvml driver-unload --state-dir DIR
  mocknvml driver-load --state-dir DIR
  mocknvml mig-mode-in-use --state-dir DIR --gpu N|UUID --times K
  mocknvml hold --state-dir DIR --gpu N|UUID --pid P [--name NAME] [--off]
  mocknvml mig-mode-pending --state-dir DIR --gpu N|UUID [--off]
  mocknvml rebind-on-mig-mode --state-dir DIR --gpu N|UUID [--off]
  mocknvml rebind --state-dir DIR --gpu N|UUID
  mocknvml reset --state-dir DIR --gpu N|UUID
  mocknvml use --state-dir DIR (--gpu N|UUID [--mem P] | --mig UUID) [--sm P] [--mem-used SIZE]
  mocknvml use-unsupported --state-dir DIR --gpu N|UUID [--off]
  mocknvml proc --state-dir DIR (--gpu N|UUID | --mig UUID) --pid P [--name NAME] [--sm P] [--mem P] [--mem-used SIZE]
  mocknvml proc --state-dir DIR --pid P --end
--state-dir defaults to $MOCK_NVML_STATE_DIR`

var commands = map[string]func(args []string) error{
	"reboot":             reboot,
	"xid":                xid,
	"ecc":                ecc,
	"lost":               func(args []string) error { return setLost("lost", args, true) },
	"recover":            func(args []string) error { return setLost("recover", args, false) },
	"mig-destroy-fails":  migDestroyFails,
	"clear":              clearFaults,
	"mig-layout":         migLayout,
	"row-remap":          rowRemap,
	"unknown-generation": unknownGeneration,
	"slow-create":        slowCreate,
	"mig-mode-in-use":    migModeInUse,
	"hold":               hold,
	"mig-mode-pending":   migModePending,
	"rebind-on-mig-mode": rebindOnMigMode,
	"rebind":             rebind,
	"reset":              reset,
	"use":                use,
	"use-unsupported":    useUnsupported,
	"proc":               proc,
	"driver-unload":      func(args []string) error { return driverModule("driver-unload", args, nvmock.UnloadDriver) },
	"driver-load":        func(args []string) error { return driverModule("driver-load", args, nvmock.LoadDriver) },
}

// driverModule unloads or loads the mock driver module.
func driverModule(name string, args []string, do func(stateDir string) error) error {
	c := newCommand(name, false)
	if err := c.parse(args); err != nil {
		return err
	}
	return do(*c.stateDir)
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mocknvml:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	cmd, ok := commands[args[0]]
	if !ok {
		return fmt.Errorf("unknown command %q\n%s", args[0], usage)
	}
	return cmd(args[1:])
}

// command is one subcommand's flags, --state-dir always among them.
type command struct {
	fs       *flag.FlagSet
	stateDir *string
	gpu      *string
}

func newCommand(name string, withGPU bool) *command {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	c := &command{fs: fs, stateDir: fs.String("state-dir", os.Getenv("MOCK_NVML_STATE_DIR"), "the plugin's --mock-nvml-state-dir [$MOCK_NVML_STATE_DIR]")}
	if withGPU {
		c.gpu = fs.String("gpu", "", "the GPU, by index or UUID")
	}
	return c
}

// parse parses the flags and checks that the ones every use needs are set.
func (c *command) parse(args []string) error {
	if err := c.fs.Parse(args); err != nil {
		return err
	}
	switch {
	case c.fs.NArg() != 0:
		return fmt.Errorf("unexpected arguments %q\n%s", c.fs.Args(), usage)
	case *c.stateDir == "":
		return fmt.Errorf("%s needs --state-dir or $MOCK_NVML_STATE_DIR\n%s", c.fs.Name(), usage)
	case c.gpu != nil && *c.gpu == "":
		return fmt.Errorf("%s needs --gpu\n%s", c.fs.Name(), usage)
	}
	return nil
}

func reboot(args []string) error {
	c := newCommand("reboot", false)
	bootIDPath := c.fs.String("boot-id-path", os.Getenv("BOOT_ID_PATH"), "the plugin's --boot-id-path, given a new boot ID; empty: none written [$BOOT_ID_PATH]")
	if err := c.parse(args); err != nil {
		return err
	}
	id, err := nvmock.Reboot(*c.stateDir, *bootIDPath)
	if err != nil {
		return err
	}
	fmt.Println(id)
	return nil
}

func xid(args []string) error {
	c := newCommand("xid", true)
	code := c.fs.Uint64("code", 0, "the XID, e.g. 48 (double-bit ECC), 79 (fallen off the bus), 94 (contained ECC)")
	gi, ci := nvmock.WholeGPU, nvmock.WholeGPU
	c.fs.Func("gi", "the GPU instance ID of the MIG device it happened on (default: the whole GPU)", instanceID(&gi))
	c.fs.Func("ci", "the compute instance ID of the MIG device it happened on (default: the whole GPU)", instanceID(&ci))
	if err := c.parse(args); err != nil {
		return err
	}
	if *code == 0 {
		return fmt.Errorf("xid needs --code, the XID to report\n%s", usage)
	}
	return nvmock.InjectEvent(*c.stateDir, *c.gpu, nvml.EventTypeXidCriticalError, *code, gi, ci)
}

// instanceID parses a GPU or compute instance ID into id.
func instanceID(id *uint32) func(string) error {
	return func(s string) error {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return fmt.Errorf("want an instance ID: %w", err)
		}
		*id = uint32(n)
		return nil
	}
}

func ecc(args []string) error {
	c := newCommand("ecc", true)
	if err := c.parse(args); err != nil {
		return err
	}
	return nvmock.InjectEvent(*c.stateDir, *c.gpu, nvml.EventTypeDoubleBitEccError, 0, nvmock.WholeGPU, nvmock.WholeGPU)
}

func setLost(name string, args []string, lost bool) error {
	c := newCommand(name, true)
	if err := c.parse(args); err != nil {
		return err
	}
	return nvmock.SetGPULost(*c.stateDir, *c.gpu, lost)
}

func migDestroyFails(args []string) error {
	c := newCommand("mig-destroy-fails", true)
	off := c.fs.Bool("off", false, "let the GPU's MIG instances be destroyed again")
	if err := c.parse(args); err != nil {
		return err
	}
	return nvmock.SetMigDestroyFails(*c.stateDir, *c.gpu, !*off)
}

func clearFaults(args []string) error {
	c := newCommand("clear", false)
	if err := c.parse(args); err != nil {
		return err
	}
	return nvmock.ClearFaults(*c.stateDir)
}

func migLayout(args []string) error {
	c := newCommand("mig-layout", true)
	profiles := c.fs.String("profiles", "", "the MIG profiles to make, comma-separated, e.g. 3g.40gb,2g.20gb,1g.10gb")
	machine := c.fs.String("machine", "", "the mock machine (dgxh100, ...), for a state directory no plugin has used yet")
	seed := c.fs.String("seed", "", "the plugin's node name, for a state directory no plugin has used yet")
	if err := c.parse(args); err != nil {
		return err
	}
	index, err := strconv.Atoi(*c.gpu)
	if err != nil || *profiles == "" {
		return fmt.Errorf("mig-layout needs --gpu as an index and --profiles\n%s", usage)
	}
	made, err := nvmock.LayoutMIG(*c.stateDir, *machine, *seed, index, strings.Split(*profiles, ","))
	for _, inst := range made {
		fmt.Printf("%s at memory slice %d: %s (GPU instance %d, compute instance %d)\n", inst.Profile, inst.Placement.Start, inst.UUID, inst.GIID, inst.CIID)
	}
	return err
}

func rowRemap(args []string) error {
	c := newCommand("row-remap", true)
	off := c.fs.Bool("off", false, "the pending remapping was applied (a reset)")
	if err := c.parse(args); err != nil {
		return err
	}
	return nvmock.SetRowRemapPending(*c.stateDir, *c.gpu, !*off)
}

func unknownGeneration(args []string) error {
	c := newCommand("unknown-generation", true)
	off := c.fs.Bool("off", false, "the GPU answers its own brand and architecture again")
	if err := c.parse(args); err != nil {
		return err
	}
	return nvmock.SetUnknownGeneration(*c.stateDir, *c.gpu, !*off)
}

func slowCreate(args []string) error {
	c := newCommand("slow-create", false)
	delay := c.fs.Duration("delay", time.Second, "how long creating a GPU instance takes")
	if err := c.parse(args); err != nil {
		return err
	}
	return nvmock.SetCreateDelay(*c.stateDir, *delay)
}

func migModeInUse(args []string) error {
	c := newCommand("mig-mode-in-use", true)
	times := c.fs.Int("times", 1, "how many of the GPU's next MIG mode changes answer ERROR_IN_USE; 0 for none")
	if err := c.parse(args); err != nil {
		return err
	}
	return nvmock.SetMigModeInUse(*c.stateDir, *c.gpu, *times)
}

func hold(args []string) error {
	c := newCommand("hold", true)
	pid := c.fs.Uint("pid", 0, "the process ID NVML lists on the GPU")
	name := c.fs.String("name", "", "the process's name, e.g. dcgm-exporter")
	off := c.fs.Bool("off", false, "the process lets go of the GPU")
	if err := c.parse(args); err != nil {
		return err
	}
	if *pid == 0 || *pid > math.MaxUint32 {
		return fmt.Errorf("hold needs --pid, a process ID\n%s", usage)
	}
	return nvmock.SetHolder(*c.stateDir, *c.gpu, nvmock.Process{PID: uint32(*pid), Name: *name}, !*off)
}

func migModePending(args []string) error {
	c := newCommand("mig-mode-pending", true)
	off := c.fs.Bool("off", false, "MIG mode changes take effect at once again")
	if err := c.parse(args); err != nil {
		return err
	}
	return nvmock.SetMigModePending(*c.stateDir, *c.gpu, !*off)
}

func rebindOnMigMode(args []string) error {
	c := newCommand("rebind-on-mig-mode", true)
	off := c.fs.Bool("off", false, "MIG mode changes keep the GPU's minor number again")
	if err := c.parse(args); err != nil {
		return err
	}
	return nvmock.SetRebindOnMigMode(*c.stateDir, *c.gpu, !*off)
}

func rebind(args []string) error {
	c := newCommand("rebind", true)
	if err := c.parse(args); err != nil {
		return err
	}
	return nvmock.RebindGPU(*c.stateDir, *c.gpu)
}

func reset(args []string) error {
	c := newCommand("reset", true)
	if err := c.parse(args); err != nil {
		return err
	}
	return nvmock.ResetGPU(*c.stateDir, *c.gpu)
}
