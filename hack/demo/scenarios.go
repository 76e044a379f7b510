package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// scenarios are what the demo does after the report of the specs: they are
// written for the built-in specs and their node layout, so with a specs
// directory of one's own they run only when asked for (--scenarios).
type scenarios struct {
	// health injects an XID and drains a device on the real node, and the
	// posture table waits until it shows both.
	health bool
	// shapes applies demo/shapes and reports each shape's pod.
	shapes bool
	// queueing runs Kueue's manager and demo/queueing.
	queueing bool
	// use runs demo/usage on the real node: a busy and an idle pod on one
	// time-sliced GPU, what the plugin measured, what the idle policy did.
	use bool
	// freeSpecPods lets the shapes and queueing scenarios delete the specs' pods so
	// that its jobs find free GPUs: only the built-in specs' pods, which
	// are the demo's own; one's own pods are never deleted.
	freeSpecPods bool
}

// scenarioNames are the values --scenarios takes, besides all and none.
var scenarioNames = []string{"health", "shapes", "queueing", "use"}

// parseScenarios reads --scenarios: "" (the default) runs every scenario
// with the built-in specs and none with one's own; otherwise "all",
// "none", or a comma-separated list of scenarioNames.
func parseScenarios(value string, builtinSpecs bool) (scenarios, error) {
	s := scenarios{freeSpecPods: builtinSpecs}
	switch value {
	case "":
		if !builtinSpecs {
			return scenarios{}, nil
		}
		value = "all"
	case "none":
		return scenarios{}, nil
	}
	if value == "all" {
		s.health, s.shapes, s.queueing, s.use = true, true, true, true
		return s, nil
	}
	for _, name := range strings.Split(value, ",") {
		switch name {
		case "health":
			s.health = true
		case "shapes":
			s.shapes = true
		case "queueing":
			s.queueing = true
		case "use":
			s.use = true
		default:
			return scenarios{}, fmt.Errorf("--scenarios=%q: want all, none, or a comma-separated list of %s", value, strings.Join(scenarioNames, ", "))
		}
	}
	return s, nil
}

// isBuiltinSpecs says whether --specs names the built-in demo/specs of
// the repository at root ("" is the default, which does).
func isBuiltinSpecs(specs, root string) bool {
	if specs == "" {
		return true
	}
	abs, err := filepath.Abs(specs)
	if err != nil {
		return false
	}
	return abs == filepath.Join(root, "demo", "specs")
}

// keepAfter says whether --keep leaves the cluster up after the demo
// ended with err: always, a failure included (the cluster is then what
// one wants to look at), except when the user interrupted it, which is
// the request to stop.
func keepAfter(keep bool, err error) bool {
	return keep && !errors.Is(err, context.Canceled)
}
