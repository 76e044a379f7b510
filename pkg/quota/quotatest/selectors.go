// Package quotatest holds what tests and benchmarks of the quota's
// pricing share across packages: selectors of a known cost.
package quotatest

import (
	"fmt"
	"strings"
)

// DearSelector is a CEL selector of 10 KiB, dear to evaluate (a
// comprehension and about a thousand comparisons a device) yet within one
// claim's CEL budget six times over 128 devices: the red team's "claims
// slow to price, each admitted" (issue 55 route 5) and the largest
// selectors of the admission attack benchmarks (issue 36). Distinct by salt, so
// no compiled selector or price is reused.
func DearSelector(salt string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, `%q != "" && [1, 2, 3].all(x, x > 0)`, salt)
	for i := 0; sb.Len() < 10<<10-64; i++ {
		fmt.Fprintf(&sb, ` && %d > -1`, i)
	}
	return sb.String()
}
