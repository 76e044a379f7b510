package slicecache

import (
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
)

// shareSlice shares, in place, what s holds that other slices hold too.
func (sh sharer) slice(s *resourceapi.ResourceSlice) {
	spec := &s.Spec
	spec.Driver = sh.intern(spec.Driver)
	spec.Pool.Name = sh.intern(spec.Pool.Name)
	for i := range spec.SharedCounters {
		cs := &spec.SharedCounters[i]
		cs.Name = sh.intern(cs.Name)
		cs.Counters = sh.counters(cs.Counters)
	}
	for i := range spec.Devices {
		sh.device(&spec.Devices[i])
	}
}

func (sh sharer) device(d *resourceapi.Device) {
	d.Name = sh.intern(d.Name)
	if d.Attributes != nil {
		// A map the decoder grew one entry at a time holds several times
		// the room its entries need; one made to size does not.
		attrs := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(d.Attributes))
		for name, attr := range d.Attributes {
			attrs[resourceapi.QualifiedName(sh.intern(string(name)))] = sh.attribute(attr)
		}
		d.Attributes = attrs
	}
	if len(d.Capacity) > 0 {
		d.Capacity = sh.encoded("capacity", &resourceapi.Device{Capacity: d.Capacity}, d.Capacity).(map[resourceapi.QualifiedName]resourceapi.DeviceCapacity)
	}
	if len(d.ConsumesCounters) > 0 {
		d.ConsumesCounters = sh.encoded("consumes", &resourceapi.Device{ConsumesCounters: d.ConsumesCounters}, d.ConsumesCounters).([]resourceapi.DeviceCounterConsumption)
	}
}

// shareAttribute shares an attribute's value: strings by content, numbers
// and booleans by pointer.
func (sh sharer) attribute(a resourceapi.DeviceAttribute) resourceapi.DeviceAttribute {
	switch {
	case a.StringValue != nil:
		*a.StringValue = sh.intern(*a.StringValue)
	case a.VersionValue != nil:
		*a.VersionValue = sh.intern(*a.VersionValue)
	case a.BoolValue != nil:
		a.BoolValue = sharedBool(*a.BoolValue)
	case a.IntValue != nil:
		a.IntValue = sh.parts.share("int\x00"+strconv.FormatInt(*a.IntValue, 10), a.IntValue).(*int64)
	}
	return a
}

func (sh sharer) counters(c map[string]resourceapi.Counter) map[string]resourceapi.Counter {
	if len(c) == 0 {
		return c
	}
	return sh.encoded("counters", &resourceapi.CounterSet{Counters: c}, c).(map[string]resourceapi.Counter)
}

var trueValue, falseValue = true, false

func sharedBool(b bool) *bool {
	if b {
		return &trueValue
	}
	return &falseValue
}

// marshaller is a generated protobuf type: its encoding orders map keys,
// so equal contents encode alike.
type marshaller interface{ Marshal() ([]byte, error) }

// shareEncoded shares part, whose content enc encodes, with the parts of
// the same kind and encoding. A part that cannot be encoded (no decoded
// object is one) is kept as it is.
func (sh sharer) encoded(kind string, enc marshaller, part any) any {
	b, err := enc.Marshal()
	if err != nil {
		return part
	}
	return sh.parts.share(kind+"\x00"+string(b), part)
}
