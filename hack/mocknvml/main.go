// Command mocknvml acts on the persistent mock machines that
// dra-kubelet-plugin --nvml=mock:<machine> --mock-nvml-state-dir=DIR keeps
// in DIR, from outside the plugin, as a node's owner acts on real GPUs.
//
//	mocknvml reboot --state-dir DIR [--boot-id-path FILE]
//
// reboot simulates a node reboot: MIG devices and compute modes are lost
// (MIG mode too, except on Ampere) and FILE, the plugin's --boot-id-path,
// gets a new boot ID, which it prints. Stop the plugin first, as a reboot
// would, and start it again after.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
)

const usage = "usage: mocknvml reboot --state-dir DIR [--boot-id-path FILE]"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mocknvml:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 || args[0] != "reboot" {
		return errors.New(usage)
	}
	fs := flag.NewFlagSet("reboot", flag.ContinueOnError)
	stateDir := fs.String("state-dir", os.Getenv("MOCK_NVML_STATE_DIR"), "the plugin's --mock-nvml-state-dir [$MOCK_NVML_STATE_DIR]")
	bootIDPath := fs.String("boot-id-path", os.Getenv("BOOT_ID_PATH"), "the plugin's --boot-id-path, given a new boot ID; empty: none written [$BOOT_ID_PATH]")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *stateDir == "" || fs.NArg() != 0 {
		return errors.New(usage)
	}
	id, err := nvdev.RebootMock(*stateDir, *bootIDPath)
	if err != nil {
		return err
	}
	fmt.Println(id)
	return nil
}
