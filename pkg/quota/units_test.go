package quota

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

func TestUnitsString(t *testing.T) {
	tests := []struct {
		u    Units
		want string
	}{
		{Units{}, "0"},
		{WholeUnits(3), "3"},
		{NewUnits(5, 2), "2.5"},
		{NewUnits(1, 8), "0.125"},
		{NewUnits(3, 7), "3/7 (~0.429)"},
		{NewUnits(-1, 4), "-0.25"},
	}
	for _, tt := range tests {
		if got := tt.u.String(); got != tt.want {
			t.Errorf("String(%v) = %q, want %q", tt.u.rat(), got, tt.want)
		}
	}
}

func TestUnitsFromQuantity(t *testing.T) {
	tests := []struct {
		q    string
		want Units
	}{
		{"2.5", NewUnits(5, 2)},
		{"1", WholeUnits(1)},
		{"100m", NewUnits(1, 10)},
		{"1k", WholeUnits(1000)},
		{"0", Units{}},
		{"1.125", NewUnits(9, 8)},
	}
	for _, tt := range tests {
		if got := UnitsFromQuantity(resource.MustParse(tt.q)); got.Cmp(tt.want) != 0 {
			t.Errorf("UnitsFromQuantity(%s) = %s, want %s", tt.q, got, tt.want)
		}
	}
}

// Seven 1g slices are exactly one GPU: no float drift lets a tenant at
// limit 1 take an eighth.
func TestUnitsExactSum(t *testing.T) {
	var sum Units
	for range 7 {
		sum = sum.Add(NewUnits(1, 7))
	}
	if sum.Cmp(WholeUnits(1)) != 0 {
		t.Fatalf("7 x 1/7 = %s, want 1", sum)
	}
	if sum.Add(NewUnits(1, 7)).Cmp(WholeUnits(1)) <= 0 {
		t.Fatal("8 x 1/7 should exceed 1")
	}
}

func TestUnitsImmutable(t *testing.T) {
	a := NewUnits(1, 2)
	b := a.Add(NewUnits(1, 2))
	_ = a.Mul(10)
	_ = a.Sub(WholeUnits(3))
	if a.Cmp(NewUnits(1, 2)) != 0 || b.Cmp(WholeUnits(1)) != 0 {
		t.Fatalf("operands changed: a=%s b=%s", a, b)
	}
}

func TestCeilQuantity(t *testing.T) {
	tests := []struct {
		u    Units
		want string
	}{
		{NewUnits(3, 7), "429m"},
		{NewUnits(1, 7), "143m"},
		{WholeUnits(2), "2"},
		{NewUnits(5, 2), "2500m"},
		{Units{}, "0"},
	}
	for _, tt := range tests {
		q := tt.u.CeilQuantity()
		if got := q.String(); got != tt.want {
			t.Errorf("CeilQuantity(%s) = %s, want %s", tt.u, got, tt.want)
		}
	}
}

// FloorMilli matches the gpu-milliunits counter the plugin publishes
// (docs/kueue.md): 1g of 7 = 142, a replica of 4 = 250.
func TestFloorMilli(t *testing.T) {
	for _, tt := range []struct {
		u    Units
		want int64
	}{
		{NewUnits(1, 7), 142}, {NewUnits(3, 7), 428}, {NewUnits(1, 4), 250}, {WholeUnits(1), 1000}, {Units{}, 0},
	} {
		if got := tt.u.FloorMilli(); got != tt.want {
			t.Errorf("FloorMilli(%s) = %d, want %d", tt.u, got, tt.want)
		}
	}
}

func TestTally(t *testing.T) {
	var tally Tally
	for range 7 {
		tally.Add(Charge{Units: NewUnits(1, 7), Memory: 10, Devices: map[string]int64{"mig": 1}}, true)
	}
	tally.Add(Charge{Units: WholeUnits(1), Memory: 80}, false)
	tally.AddUsage(Usage{Used: Charge{Units: NewUnits(1, 2)}, Claims: 1})
	u := tally.Usage()
	if u.Used.Units.Cmp(NewUnits(3, 2)) != 0 || u.Used.Memory != 70 || u.Used.Devices["mig"] != 7 ||
		u.Reserved.Units.Cmp(WholeUnits(1)) != 0 || u.Claims != 9 {
		t.Fatalf("usage = %+v", u)
	}
	tally.Add(Charge{Units: WholeUnits(5)}, true)
	if u.Used.Units.Cmp(NewUnits(3, 2)) != 0 {
		t.Fatal("a usage taken earlier changed with the tally")
	}
}
