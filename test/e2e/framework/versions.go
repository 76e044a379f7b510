package framework

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Environment of a suite run on another Kubernetes version (make
// test-versions): the suite's own control plane and real-node kubelet are
// that version's, with those gates.
const (
	// SuiteVersionEnv names a version built by hack/build-k8s-version.sh
	// (v1.34.4); empty: the version of hack/k8s-bins.
	SuiteVersionEnv = "E2E_SUITE_K8S"
	// SuiteGatesEnv is every component's --feature-gates; DocGates takes
	// the gates docs/install.md tells that version's admins to enable.
	SuiteGatesEnv = "E2E_SUITE_GATES"
	// SuiteKubeletEnv names the version of the real node's kubelet where
	// it is not the control plane's (a skew): a version built into
	// _output/k8s, or OwnKubelet for hack/k8s-bins' own. Empty: the
	// control plane's.
	SuiteKubeletEnv = "E2E_SUITE_KUBELET_K8S"
	// OwnKubelet stands for the kubelet of hack/k8s-bins (BinDir).
	OwnKubelet = "own"
	// DocGates stands for docs/install.md's gates of a version.
	DocGates = "docs"
	// DefaultGates stands for the version's own defaults (no
	// --feature-gates), as an empty SuiteGatesEnv does: a name make can
	// loop over.
	DefaultGates = "defaults"
)

// SuiteGates is SuiteGatesEnv, with DefaultGates as "".
func SuiteGates() string {
	if g := os.Getenv(SuiteGatesEnv); g != DefaultGates {
		return g
	}
	return ""
}

// VersionBinDir is where hack/build-k8s-version.sh puts version's binaries.
func VersionBinDir(version string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "_output", "k8s", version), nil
}

// suiteVersion fills opts from SuiteVersionEnv and SuiteGatesEnv. It
// refuses gates the version has removed (CheckGates).
func suiteVersion(opts *Options) error {
	version, gates := os.Getenv(SuiteVersionEnv), SuiteGates()
	if version != "" {
		dir, err := VersionBinDir(version)
		if err != nil {
			return err
		}
		opts.VersionBinDir = dir
	}
	switch kubelet := os.Getenv(SuiteKubeletEnv); kubelet {
	case "":
	case OwnKubelet:
		opts.KubeletBinDir = opts.BinDir
	default:
		dir, err := VersionBinDir(kubelet)
		if err != nil {
			return err
		}
		opts.KubeletBinDir = dir
	}
	if opts.KubeletBinDir != "" {
		if _, err := os.Stat(filepath.Join(opts.KubeletBinDir, "kubelet")); err != nil {
			return fmt.Errorf("the kubelet %s=%s names: %w", SuiteKubeletEnv, os.Getenv(SuiteKubeletEnv), err)
		}
	}
	opts.FeatureGates = gates
	if gates == DocGates {
		root, err := RepoRoot()
		if err != nil {
			return err
		}
		doc, err := InstallDocGates(root, version)
		if err != nil {
			return err
		}
		opts.FeatureGates, opts.RuntimeConfig = doc.FeatureGates, doc.RuntimeConfig
	}
	return CheckGates(version, opts.FeatureGates)
}

// DocSettings are what docs/install.md tells a version's admins to set.
type DocSettings struct {
	// FeatureGates of every component, as --feature-gates.
	FeatureGates string
	// RuntimeConfig of the API server, as --runtime-config.
	RuntimeConfig string
}

// InstallDocGates reads docs/install.md's gate table: the gates whose cell
// in version's column (v1.34.4: "1.34") says "enable", as --feature-gates,
// and the API versions its `--runtime-config` row names there. A
// component refuses a gate its version lacks, so a table that names one
// fails the run (it did: DRADeviceTaintRules for 1.34).
func InstallDocGates(repoRoot, version string) (DocSettings, error) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "install.md"))
	if err != nil {
		return DocSettings{}, fmt.Errorf("reading the gate table: %w", err)
	}
	parts := strings.Split(strings.TrimPrefix(version, "v"), ".")
	if len(parts) < 2 {
		return DocSettings{}, fmt.Errorf("version %q is not vMAJOR.MINOR[.PATCH]", version)
	}
	minor := strings.Join(parts[:2], ".")
	col := -1
	var gates, apis []string
	for _, line := range strings.Split(string(b), "\n") {
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 3 {
			continue
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if cells[0] == "used for" {
			col = slices.Index(cells, minor)
			continue
		}
		if col < 0 || col >= len(cells) {
			continue
		}
		if strings.HasPrefix(cells[1], "`--runtime-config`") {
			// The cell names the API version to serve, or says it is.
			if api := strings.Split(cells[col], "`"); len(api) == 3 {
				apis = append(apis, api[1])
			}
			continue
		}
		if !strings.HasPrefix(cells[col], "enable") {
			continue
		}
		for _, part := range strings.Split(cells[1], "`")[1:] {
			if name, _, _ := strings.Cut(part, " "); name != "" && !strings.ContainsAny(name, "(),") {
				gates = append(gates, name+"=true")
			}
		}
	}
	if col < 0 {
		return DocSettings{}, errors.New("docs/install.md has no gate table column " + minor)
	}
	doc := DocSettings{FeatureGates: strings.Join(gates, ","), RuntimeConfig: strings.Join(apis, ",")}
	if err := CheckGates(version, doc.FeatureGates); err != nil {
		return DocSettings{}, fmt.Errorf("docs/install.md's column %s: %w", minor, err)
	}
	return doc, nil
}

// RemovedGates are feature gates by the minor that removed them: a
// component of that minor or newer given one does not start ("unrecognized
// feature gate"). 1.38 removed DynamicResourceAllocation (GA and locked on
// since 1.35).
var RemovedGates = map[string][]string{
	"1.38": {"DynamicResourceAllocation"},
}

// CheckGates refuses a --feature-gates value (name=value,...) that names a
// gate version (v1.38.0; empty: the default version, which has none
// removed) no longer has.
func CheckGates(version, gates string) error {
	if version == "" || gates == "" {
		return nil
	}
	minor, err := minorOf(version)
	if err != nil {
		return err
	}
	for _, kv := range strings.Split(gates, ",") {
		name, _, _ := strings.Cut(strings.TrimSpace(kv), "=")
		for removedIn, names := range RemovedGates {
			if slices.Contains(names, name) && minor >= mustMinor(removedIn) {
				return fmt.Errorf("feature gate %s was removed in Kubernetes %s: a %s component refuses it", name, removedIn, version)
			}
		}
	}
	return nil
}

// minorOf is the minor number of v1.MINOR[.PATCH][-pre].
func minorOf(version string) (int, error) {
	parts := strings.Split(strings.TrimPrefix(version, "v"), ".")
	if len(parts) < 2 || parts[0] != "1" {
		return 0, fmt.Errorf("version %q is not v1.MINOR[.PATCH]", version)
	}
	var n int
	if _, err := fmt.Sscanf(parts[1], "%d", &n); err != nil {
		return 0, fmt.Errorf("version %q: minor %q: %w", version, parts[1], err)
	}
	return n, nil
}

func mustMinor(v string) int {
	n, err := minorOf(v)
	if err != nil {
		panic(err)
	}
	return n
}
