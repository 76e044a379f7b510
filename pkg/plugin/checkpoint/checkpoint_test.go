package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
)

func testClaim(uid string) *Claim {
	return &Claim{UID: uid, Namespace: "ns", Name: "c-" + uid, State: PrepareCompleted,
		Devices: []Device{{Requests: []string{"gpu"}, Pool: "node", Device: "gpu-1", GPUUUID: "GPU-1",
			CDIDeviceIDs: []string{"k8s.gpu.gpuaas.io/claim=" + uid + "-gpu-1"}}}}
}

func TestSaveLoadDelete(t *testing.T) {
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a, b := testClaim("a"), testClaim("b")
	for _, c := range []*Claim{a, b, a} { // saving again overwrites
		if err := s.Save(c); err != nil {
			t.Fatal(err)
		}
	}
	claims, damaged, err := s.LoadAll()
	if err != nil || len(damaged) != 0 {
		t.Fatalf("LoadAll: %v, damaged %v", err, damaged)
	}
	if len(claims) != 2 || !reflect.DeepEqual(claims[0], a) || !reflect.DeepEqual(claims[1], b) {
		t.Fatalf("LoadAll = %+v", claims)
	}
	if err := s.Delete("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("a"); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	claims, _, _ = s.LoadAll()
	if len(claims) != 1 || claims[0].UID != "b" {
		t.Fatalf("after delete: %+v", claims)
	}
	assertNoTempFiles(t, s.dir)
}

func assertNoTempFiles(t *testing.T, dir string) {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			t.Errorf("temporary file left behind: %s", e.Name())
		}
	}
}

func TestDamagedFilesAreReportedAndMovedAside(t *testing.T) {
	dir := t.TempDir()
	s, _ := NewStore(dir)
	for _, uid := range []string{"good", "flipped", "truncated", "future", "swapped"} {
		if err := s.Save(testClaim(uid)); err != nil {
			t.Fatal(err)
		}
	}
	corrupt(t, s.Path("flipped"), func(b []byte) []byte {
		return []byte(strings.Replace(string(b), "gpu-1", "gpu-7", 1))
	})
	corrupt(t, s.Path("truncated"), func(b []byte) []byte { return b[:len(b)/2] })
	corrupt(t, s.Path("future"), func(b []byte) []byte {
		return []byte(strings.Replace(string(b), `"version":"v1"`, `"version":"v9"`, 1))
	})
	good, _ := os.ReadFile(s.Path("good"))
	if err := os.WriteFile(s.Path("swapped"), good, 0o600); err != nil {
		t.Fatal(err)
	}

	claims, damaged, err := s.LoadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(claims) != 1 || claims[0].UID != "good" {
		t.Errorf("good claims = %+v", claims)
	}
	got := map[string]bool{}
	for _, d := range damaged {
		if !errors.Is(d.Err, ErrDamaged) {
			t.Errorf("%s: error %v is not ErrDamaged", d.UID, d.Err)
		}
		// Issue 40: a record of a later format (a rollback) says so.
		if newer := errors.Is(d.Err, ErrNewerFormat); newer != (d.UID == "future") ||
			(newer && !strings.Contains(d.Err.Error(), `format "v9", this plugin reads "v1"`)) {
			t.Errorf("%s: error %v (ErrNewerFormat: %v)", d.UID, d.Err, newer)
		}
		got[d.UID] = true
		if _, err := os.Stat(s.Path(d.UID) + ".damaged"); err != nil {
			t.Errorf("%s not moved aside: %v", d.UID, err)
		}
	}
	if len(got) != 4 || !got["flipped"] || !got["truncated"] || !got["future"] || !got["swapped"] {
		t.Errorf("damaged = %v", damaged)
	}
	// A second load no longer sees them: a damaged file never loops.
	if _, damaged, _ := s.LoadAll(); len(damaged) != 0 {
		t.Errorf("damaged again on second load: %v", damaged)
	}
}

func TestUnknownFieldsFromANewerWriterKeepTheChecksum(t *testing.T) {
	// The checksum covers the stored bytes, so a field this version does not
	// know (written by a newer plugin) does not make the record look damaged.
	s, _ := NewStore(t.TempDir())
	claim := []byte(`{"uid":"u","namespace":"n","name":"c","state":"PrepareCompleted","devices":[],"newField":1}`)
	data, _ := encodeRaw(claim)
	if err := os.WriteFile(s.Path("u"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	claims, damaged, _ := s.LoadAll()
	if len(damaged) != 0 || len(claims) != 1 {
		t.Fatalf("claims %v damaged %v", claims, damaged)
	}
}

func encodeRaw(claim []byte) ([]byte, error) {
	return []byte(`{"version":"v1","checksum":"` + checksum(claim) + `","claim":` + string(claim) + `}`), nil
}

func corrupt(t *testing.T, path string, f func([]byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, f(b), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestIgnoresForeignFiles(t *testing.T) {
	dir := t.TempDir()
	s, _ := NewStore(dir)
	_ = os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o600)
	_ = os.Mkdir(filepath.Join(dir, "sub.json"), 0o700)
	claims, damaged, err := s.LoadAll()
	if err != nil || len(claims) != 0 || len(damaged) != 0 {
		t.Fatalf("claims %v damaged %v err %v", claims, damaged, err)
	}
}

func TestLoadAndListChangeNothing(t *testing.T) {
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Save(testClaim("a")); err != nil {
		t.Fatal(err)
	}
	if c, err := s.Load("a"); err != nil || !reflect.DeepEqual(c, testClaim("a")) {
		t.Errorf("Load(a) = %+v, %v", c, err)
	}
	if c, err := s.Load("none"); err != nil || c != nil {
		t.Errorf("Load of a claim without record = %+v, %v; want nil, nil", c, err)
	}
	if err := os.WriteFile(s.Path("bad"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	claims, damaged, err := s.List()
	if err != nil || len(claims) != 1 || len(damaged) != 1 || damaged[0].UID != "bad" || !errors.Is(damaged[0].Err, ErrDamaged) {
		t.Fatalf("List = %+v, %+v, %v", claims, damaged, err)
	}
	if _, err := os.Stat(s.Path("bad")); err != nil {
		t.Errorf("List moved a damaged record: %v", err)
	}
}

func TestRemoveTemp(t *testing.T) {
	dir := t.TempDir()
	s, err := NewStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Save(testClaim("a")); err != nil {
		t.Fatal(err)
	}
	// What a write killed between creating and renaming its file leaves.
	if err := os.WriteFile(filepath.Join(dir, tempPrefix+"b.json-123"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveTemp(); err != nil {
		t.Fatal(err)
	}
	assertNoTempFiles(t, dir)
	if c, err := s.Load("a"); err != nil || c == nil {
		t.Errorf("RemoveTemp took a record: %v", err)
	}
}

// A record written before a MIG device is created names the intent, and
// reads back with it: the undo after a crash depends on it.
func TestMIGIntentRoundTrips(t *testing.T) {
	s, err := NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := testClaim("m")
	c.State = PrepareStarted
	c.Devices[0].MIGIntent = &mig.Intent{Profile: "2g.20gb", GIProfileID: 14, Placement: mig.Placement{Start: 4, Size: 2}}
	if err := s.Save(c); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load("m")
	if err != nil || !reflect.DeepEqual(got, c) {
		t.Fatalf("Load = %+v, %v; want %+v", got, err, c)
	}
}
