package shapes

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/google/cel-go/common"
	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/parser"

	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// AnyDriver, among the drivers a shape reaches, stands for every other
// driver: a class of the shape does not pin one.
const AnyDriver = ""

// otherDrivers are the drivers other than ours whose devices the shape's
// classes (parts.Classes) can select, AnyDriver among them when a class
// does not pin its driver: the only other drivers' slices the shape's
// count reads. A class pins a driver when one of its CEL selectors is, or
// is a conjunction (&&) with, `device.driver == "<name>"`, as DRA's
// classes (ours and the catalog's) are written. A class the shape names
// that does not exist adds none: the count has nothing to select with.
func otherDrivers(classes map[string]*resourceapi.DeviceClass) sets.Set[string] {
	out := sets.New[string]()
	for _, dc := range classes {
		d, ok := classDriver(dc)
		switch {
		case !ok:
			out.Insert(AnyDriver)
		case d != quota.DriverName:
			out.Insert(d)
		}
	}
	return out
}

// celParser parses the classes' selectors (parsing only: what a selector
// means is not needed, only its form).
var celParser = func() *parser.Parser {
	p, err := parser.NewParser()
	if err != nil {
		panic(err) // no options: cannot fail
	}
	return p
}()

// classDriver is the driver the class's selectors pin, if one does.
func classDriver(dc *resourceapi.DeviceClass) (string, bool) {
	for _, sel := range dc.Spec.Selectors {
		if sel.CEL == nil {
			continue
		}
		tree, errs := celParser.Parse(common.NewTextSource(sel.CEL.Expression))
		if errs != nil && len(errs.GetErrors()) > 0 {
			continue // the count cannot use it either
		}
		if d, ok := pinnedDriver(tree.Expr()); ok {
			return d, true
		}
	}
	return "", false
}

// pinnedDriver finds `device.driver == "<name>"` (either way round) at e or
// in a conjunction at e: every device e selects is of that driver.
func pinnedDriver(e ast.Expr) (string, bool) {
	if e.Kind() != ast.CallKind {
		return "", false
	}
	call := e.AsCall()
	args := call.Args()
	switch {
	case call.FunctionName() == operators.LogicalAnd:
		for _, a := range args {
			if d, ok := pinnedDriver(a); ok {
				return d, true
			}
		}
	case call.FunctionName() == operators.Equals && len(args) == 2:
		for i, a := range args {
			if isDeviceDriver(a) {
				return stringLiteral(args[1-i])
			}
		}
	}
	return "", false
}

func isDeviceDriver(e ast.Expr) bool {
	if e.Kind() != ast.SelectKind {
		return false
	}
	s := e.AsSelect()
	return !s.IsTestOnly() && s.FieldName() == "driver" &&
		s.Operand().Kind() == ast.IdentKind && s.Operand().AsIdent() == "device"
}

func stringLiteral(e ast.Expr) (string, bool) {
	if e.Kind() != ast.LiteralKind {
		return "", false
	}
	s, ok := e.AsLiteral().(types.String)
	return string(s), ok
}
