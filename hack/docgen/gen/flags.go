package gen

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// binaries whose flags the reference lists, with a line on what each is.
var binaries = []struct{ name, about string }{
	{"dra-kubelet-plugin", "The node side: a DaemonSet pod on every GPU node (the chart's `kubeletPlugin.*` values set these flags)."},
	{"dra-controller", "The control plane: catalog, quota webhooks, metrics (the chart's `controller.*` values set these flags)."},
}

// One flag line of pflag's usage: "  -v, --v Level   usage (default 0)".
var flagLine = regexp.MustCompile(`^\s+(?:-(\w), )?--([A-Za-z0-9-]+)(?: (\w+))?\s{2,}(.*)$`)
var envVar = regexp.MustCompile(`\s*\[\$([A-Z0-9_]+)\]`)
var defaultSuffix = regexp.MustCompile(`\s*\(default (.*)\)$`)

// FlagsReference builds both binaries and renders their --help. They run
// with an empty environment (but TMPDIR=/tmp), so defaults read from the
// environment show as they are in a pod that sets nothing.
func FlagsReference(ctx context.Context, root string) ([]byte, error) {
	bin, err := os.MkdirTemp("", "docgen-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(bin) }()
	args := []string{"build", "-o", bin + "/"}
	for _, b := range binaries {
		args = append(args, "./cmd/"+b.name)
	}
	build := exec.CommandContext(ctx, "go", args...)
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	var b strings.Builder
	b.WriteString(Banner)
	b.WriteString("# Command-line flags\n\n")
	b.WriteString("Both binaries are in the release image (`make image`). Every flag shown with an environment\n")
	b.WriteString("variable falls back to it; the chart sets flags and variables from its values\n")
	b.WriteString("([values reference](../../deployments/helm/gpuaas-dra/README.md)). Defaults are those of a\n")
	b.WriteString("process whose environment sets none of the variables. Both binaries also take `--version`.\n\n")
	for _, bi := range binaries {
		cmd := exec.CommandContext(ctx, filepath.Join(bin, bi.name), "--help")
		cmd.Env = []string{"TMPDIR=/tmp", "PATH=/usr/bin:/bin"}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("%s --help: %w\n%s", bi.name, err, out)
		}
		fmt.Fprintf(&b, "## %s\n\n%s\n\n", bi.name, bi.about)
		about, table, err := flagTable(string(out))
		if err != nil {
			return nil, fmt.Errorf("%s --help: %w", bi.name, err)
		}
		fmt.Fprintf(&b, "%s\n\n%s\n", about, table)
	}
	return []byte(strings.TrimRight(b.String(), "\n") + "\n"), nil
}

// flagTable turns pflag's usage into the text above the flags and a table.
func flagTable(help string) (string, string, error) {
	var about []string
	var t strings.Builder
	t.WriteString("| Flag | Type | Environment | Default | Description |\n|---|---|---|---|---|\n")
	inFlags, n := false, 0
	sc := bufio.NewScanner(strings.NewReader(help))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "Flags") {
			inFlags = true
			continue
		}
		if !inFlags {
			if strings.TrimSpace(line) != "" {
				about = append(about, strings.TrimSpace(line))
			}
			continue
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		m := flagLine.FindStringSubmatch(line)
		if m == nil {
			return "", "", fmt.Errorf("unexpected line in the flags: %q", line)
		}
		name, typ, usage := "--"+m[2], m[3], m[4]
		if m[1] != "" {
			name = "-" + m[1] + ", " + name
		}
		if typ == "" {
			typ = "bool"
		}
		def := ""
		if d := defaultSuffix.FindStringSubmatch(usage); d != nil {
			def = d[1]
			usage = strings.TrimSuffix(usage, d[0])
		}
		env := ""
		if e := envVar.FindStringSubmatch(usage); e != nil {
			env = "`" + e[1] + "`"
			usage = strings.Replace(usage, e[0], "", 1)
		}
		fmt.Fprintf(&t, "| `%s` | %s | %s | %s | %s |\n", name, typ, env, code(def), cell(usage))
		n++
	}
	if n == 0 {
		return "", "", fmt.Errorf("no flags found in:\n%s", help)
	}
	return strings.Join(about, " "), t.String(), sc.Err()
}
