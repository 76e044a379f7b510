package fleet

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
)

// Capture is the slices one plugin published for one node, as the API
// server stored them, to be replayed on a fleet (Options.Replay).
type Capture struct {
	Driver string                          `json:"driver"`
	Slices []resourceapi.ResourceSliceSpec `json:"slices"`
}

// The slice shapes a peer run keeps, a directory each under its output
// (test/e2e/peer writes them, test/e2e/scale replays them).
const (
	ShapeWholeGPU   = "whole-gpu"
	ShapeDynamicMIG = "dynamic-mig"
)

// captureSuffix ends the name of a capture's file: <driver>.slices.json.
const captureSuffix = ".slices.json"

// WriteCapture keeps the slices of one driver in dir, one file per driver
// (a directory per slice shape keeps the captures of several).
func WriteCapture(dir, driver string, stored []resourceapi.ResourceSlice) error {
	c := Capture{Driver: driver}
	for _, s := range stored {
		c.Slices = append(c.Slices, s.Spec)
	}
	data, err := json.MarshalIndent(c, "", " ")
	if err != nil {
		return fmt.Errorf("encoding the slices of %s: %w", driver, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("keeping the slices of %s: %w", driver, err)
	}
	if err := os.WriteFile(filepath.Join(dir, driver+captureSuffix), data, 0o644); err != nil {
		return fmt.Errorf("keeping the slices of %s: %w", driver, err)
	}
	return nil
}

// ReadCaptures reads every capture WriteCapture kept in dir, by driver
// name; none is an error.
func ReadCaptures(dir string) ([]Capture, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*"+captureSuffix))
	if err != nil {
		return nil, fmt.Errorf("captured slices in %s: %w", dir, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no captured slices (*%s) in %s", captureSuffix, dir)
	}
	slices.Sort(files)
	var out []Capture
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("reading captured slices: %w", err)
		}
		var c Capture
		if err := json.Unmarshal(data, &c); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", f, err)
		}
		if want := strings.TrimSuffix(filepath.Base(f), captureSuffix); c.Driver != want || len(c.Slices) == 0 {
			return nil, fmt.Errorf("%s: the slices of driver %q (%d), want driver %q and at least one slice", f, c.Driver, len(c.Slices), want)
		}
		out = append(out, c)
	}
	return out, nil
}
