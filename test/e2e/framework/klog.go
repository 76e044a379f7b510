package framework

import (
	"flag"
	"fmt"

	"k8s.io/klog/v2"
)

// LogToFile sends this process's klog output (the in-process node
// simulators) to path instead of stderr, so test and demo output stays
// readable; the file sits next to the component logs and is kept and
// printed like them when something fails.
func LogToFile(path string, verbosity int) error {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	for name, value := range map[string]string{
		"logtostderr":     "false",
		"alsologtostderr": "false",
		"stderrthreshold": "FATAL",
		"log_file":        path,
		"one_output":      "true",
		"v":               fmt.Sprint(verbosity),
	} {
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("setting klog flag %s: %w", name, err)
		}
	}
	return nil
}
