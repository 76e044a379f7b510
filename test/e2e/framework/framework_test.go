package framework

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// These tests need no control plane.

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestYAMLFilesOrderAndFilter(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"b/x.yaml", "00-catalog/classes.yaml", "a/README.md", "a/z.yml", "a/notes.txt"} {
		writeFile(t, filepath.Join(dir, f), "{}")
	}
	got, err := YAMLFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		got[i] = strings.TrimPrefix(got[i], dir+"/")
	}
	want := []string{"00-catalog/classes.yaml", "a/z.yml", "b/x.yaml"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("YAMLFiles = %v, want %v", got, want)
	}
}

func TestReadObjectsMultiDocument(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spec.yaml")
	writeFile(t, path, `# comment
apiVersion: v1
kind: Namespace
metadata:
  name: demo
---
---
apiVersion: v1
kind: Pod
metadata:
  name: p
  namespace: demo
---
`)
	objs, err := ReadObjects(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 || objs[0].GetKind() != "Namespace" || objs[1].GetName() != "p" {
		t.Fatalf("ReadObjects = %v, want a Namespace and a Pod", objs)
	}
}

func TestReadObjectsReportsBadYAML(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	writeFile(t, path, "kind: [unclosed\n")
	if _, err := ReadObjects(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("ReadObjects of bad YAML: %v, want an error naming the file", err)
	}
}

func TestProcessStopRestartAndLog(t *testing.T) {
	log := filepath.Join(t.TempDir(), "p.log")
	// A child of the shell proves that Stop ends the whole process group.
	// It prints 42, a text its command line (in the log header) lacks.
	p := NewProcess("sleeper", "/bin/sh", log, "-c", "echo $((40+2)); sleep 60 & wait")
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	// Each run's log header ends with the command line, "... & wait".
	waitForLog(t, p, "wait\n42", 1)
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	waitForLog(t, p, "wait\n42", 2)
	if err := p.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if exited, _ := p.Exited(); exited || p.Pid() != 0 {
		t.Error("stopped process still tracked")
	}
	if err := p.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestProcessStopReportsEarlyExit(t *testing.T) {
	p := NewProcess("failing", "/bin/sh", filepath.Join(t.TempDir(), "p.log"), "-c", "exit 3")
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for exited, _ := p.Exited(); !exited; exited, _ = p.Exited() {
		if time.Now().After(deadline) {
			t.Fatal("process did not exit")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := p.Stop(); err == nil {
		t.Error("Stop of a process that had died: no error")
	}
}

// waitForLog waits until text occurs n times in the log.
func waitForLog(t *testing.T, p *Process, text string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(p.Tail(100), text) < n {
		if time.Now().After(deadline) {
			t.Fatalf("log never contained %q:\n%s", text, p.Tail(100))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestMissingBinaries(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "etcd"), "")
	got := MissingBinaries(dir)
	want := []string{"kube-apiserver", "kube-scheduler", "kube-controller-manager"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("MissingBinaries = %v, want %v", got, want)
	}
}
