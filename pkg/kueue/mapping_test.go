package kueue

import (
	"reflect"
	"testing"
)

func TestMappingsGroupClassesByResource(t *testing.T) {
	got := Mappings([]Charge{
		{DeviceClass: "h100-1g"}, {DeviceClass: "a100", Resource: "gpu.gpuaas.io/a100-milliunits"},
		{DeviceClass: "h100"}, {DeviceClass: "h100"},
	})
	if len(got) != 2 {
		t.Fatalf("got %d mappings, want 2: %+v", len(got), got)
	}
	if got[0].Name != "gpu.gpuaas.io/a100-milliunits" || !reflect.DeepEqual(got[0].DeviceClassNames, []string{"a100"}) {
		t.Errorf("first mapping %+v", got[0])
	}
	if got[1].Name != DefaultResource || !reflect.DeepEqual(got[1].DeviceClassNames, []string{"h100", "h100-1g"}) {
		t.Errorf("second mapping %+v (classes sorted, duplicates dropped)", got[1])
	}
	for _, m := range got {
		c := m.Sources[0].Counter
		if len(m.Sources) != 1 || c == nil || c.Name != CounterName || c.Driver != Driver || c.DeviceSelector.CEL == nil {
			t.Errorf("mapping %s: sources %+v, want one counter source of %s on %s", m.Name, m.Sources, CounterName, Driver)
		}
	}
}

func TestMappingsOfNothingIsEmpty(t *testing.T) {
	if got := Mappings(nil); len(got) != 0 {
		t.Errorf("Mappings(nil) = %+v", got)
	}
}
