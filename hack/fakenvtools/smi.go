package main

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
)

var gpuUUID = regexp.MustCompile(`^GPU-[0-9a-fA-F-]+$`)

// smi serves the nvidia-smi calls the plugin makes. Bad arguments exit 2
// with a message, as the real tool fails them, so the plugin's error paths
// see what they would on a real node.
func smi(args []string) int {
	if len(args) == 0 {
		fmt.Println("stand-in nvidia-smi (gpuaas fakenvtools): no GPUs are attached to this tool")
		return 0
	}
	if args[0] != "compute-policy" {
		fmt.Fprintf(os.Stderr, "unsupported by the stand-in: %s\n", strings.Join(args, " "))
		return 2
	}
	uuid, n, err := parseComputePolicy(args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "compute-policy: %v\n", err)
		return 2
	}
	fmt.Printf("Successfully set timeslice to %d for GPU %s\n", n, uuid)
	return 0
}

// parseComputePolicy accepts `-i <uuid>` or `--id=<uuid>` and
// `--set-timeslice=<n>` (either option also with its value as the next
// argument), in any order, each once.
func parseComputePolicy(args []string) (uuid string, timeslice int, err error) {
	var id, slice *string
	for i := 0; i < len(args); i++ {
		name, val, hasVal := strings.Cut(args[i], "=")
		var dst **string
		switch name {
		case "-i", "--id":
			dst = &id
		case "--set-timeslice":
			dst = &slice
		default:
			return "", 0, fmt.Errorf("unsupported by the stand-in: option %q", args[i])
		}
		if *dst != nil {
			return "", 0, fmt.Errorf("option %s given twice", name)
		}
		if !hasVal {
			if i+1 == len(args) {
				return "", 0, fmt.Errorf("option %s needs a value", name)
			}
			i++
			val = args[i]
		}
		*dst = &val
	}
	if id == nil || slice == nil {
		return "", 0, errors.New("the stand-in needs both -i <GPU UUID> and --set-timeslice=<0..3>")
	}
	if !gpuUUID.MatchString(*id) {
		return "", 0, fmt.Errorf("invalid GPU UUID %q", *id)
	}
	n, err := strconv.Atoi(*slice)
	if err != nil || n < 0 || n > 3 {
		return "", 0, fmt.Errorf("invalid timeslice %q: want 0 (default), 1 (short), 2 (medium) or 3 (long)", *slice)
	}
	return *id, n, nil
}
