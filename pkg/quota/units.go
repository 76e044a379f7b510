package quota

import (
	"fmt"
	"math/big"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Units is an exact, immutable number of GPU units. The zero value is 0.
// Operations return new values and never modify their operands, so Units can
// be copied and shared freely (a big.Rat cannot).
type Units struct{ r *big.Rat }

// NewUnits returns num/den GPU units; den must not be zero.
func NewUnits(num, den int64) Units {
	return Units{r: big.NewRat(num, den)}
}

// WholeUnits returns n GPU units.
func WholeUnits(n int64) Units { return NewUnits(n, 1) }

// UnitsFromQuantity converts a quantity such as "2.5" exactly.
func UnitsFromQuantity(q resource.Quantity) Units {
	dec := q.AsDec()
	r := new(big.Rat).SetInt(dec.UnscaledBig())
	scale := int64(dec.Scale())
	if scale == 0 {
		return Units{r: r}
	}
	pow := new(big.Int).Exp(big.NewInt(10), big.NewInt(abs(scale)), nil)
	if scale > 0 {
		r.Quo(r, new(big.Rat).SetInt(pow))
	} else {
		r.Mul(r, new(big.Rat).SetInt(pow))
	}
	return Units{r: r}
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

func (u Units) rat() *big.Rat {
	if u.r == nil {
		return new(big.Rat)
	}
	return u.r
}

// Add returns u+v.
func (u Units) Add(v Units) Units {
	if v.r == nil {
		return u
	}
	if u.r == nil {
		return v
	}
	return Units{r: new(big.Rat).Add(u.r, v.r)}
}

// Sub returns u-v.
func (u Units) Sub(v Units) Units {
	if v.r == nil {
		return u
	}
	return Units{r: new(big.Rat).Sub(u.rat(), v.r)}
}

// Mul returns u*n.
func (u Units) Mul(n int64) Units {
	if u.r == nil || n == 1 {
		return u
	}
	return Units{r: new(big.Rat).Mul(u.r, new(big.Rat).SetInt64(n))}
}

// Scaled returns u*num/den; den must not be zero.
func (u Units) Scaled(num, den Units) Units {
	r := new(big.Rat).Mul(u.rat(), num.rat())
	return Units{r: r.Quo(r, den.rat())}
}

// Cmp compares u and v: -1, 0 or +1.
func (u Units) Cmp(v Units) int { return u.rat().Cmp(v.rat()) }

// Sign is -1, 0 or +1.
func (u Units) Sign() int { return u.rat().Sign() }

// IsZero reports u == 0.
func (u Units) IsZero() bool { return u.Sign() == 0 }

// MaxUnits returns the larger of u and v.
func MaxUnits(u, v Units) Units {
	if u.Cmp(v) >= 0 {
		return u
	}
	return v
}

// Float64 is for metrics only: gauges are floats, admission never is.
func (u Units) Float64() float64 {
	f, _ := u.rat().Float64()
	return f
}

// String writes u exactly: "2", "2.5", or "3/7" when no finite decimal
// exists, followed by its approximation: "3/7 (~0.429)".
func (u Units) String() string {
	r := u.rat()
	if r.IsInt() {
		return r.Num().String()
	}
	if s, exact := r.FloatPrec(); exact {
		return strings.TrimRight(strings.TrimRight(r.FloatString(s), "0"), ".")
	}
	return r.RatString() + " (~" + r.FloatString(3) + ")"
}

// CeilQuantity is u rounded up to thousandths, as a quantity for status:
// a rounded-down number would show a tenant under a limit it has reached.
func (u Units) CeilQuantity() resource.Quantity {
	r := new(big.Rat).Mul(u.rat(), big.NewRat(1000, 1))
	q, rem := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	if rem.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return *resource.NewMilliQuantity(q.Int64(), resource.DecimalSI)
}

// FloorMilli is u in thousandths, rounded down: what a device of u units
// publishes in the gpu-milliunits counter that Kueue charges.
func (u Units) FloorMilli() int64 {
	r := new(big.Rat).Mul(u.rat(), big.NewRat(1000, 1))
	q, _ := new(big.Int).DivMod(r.Num(), r.Denom(), new(big.Int))
	return q.Int64()
}

// Exact writes u as a rational that ParseUnits reads back: "3/7", "2".
func (u Units) Exact() string { return u.rat().RatString() }

// ParseUnits reads what Exact wrote.
func ParseUnits(s string) (Units, error) {
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return Units{}, fmt.Errorf("invalid GPU units %q", s)
	}
	return Units{r: r}, nil
}
