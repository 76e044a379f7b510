package slicecache

import (
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
)

// shareSlice shares, in place, what s holds that other slices hold too.
func (t *table) shareSlice(s *resourceapi.ResourceSlice) {
	spec := &s.Spec
	spec.Driver = intern(spec.Driver)
	spec.Pool.Name = intern(spec.Pool.Name)
	for i := range spec.SharedCounters {
		cs := &spec.SharedCounters[i]
		cs.Name = intern(cs.Name)
		cs.Counters = t.shareCounters(cs.Counters)
	}
	for i := range spec.Devices {
		t.shareDevice(&spec.Devices[i])
	}
}

func (t *table) shareDevice(d *resourceapi.Device) {
	d.Name = intern(d.Name)
	if d.Attributes != nil {
		// A map the decoder grew one entry at a time holds several times
		// the room its entries need; one made to size does not.
		attrs := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(d.Attributes))
		for name, attr := range d.Attributes {
			attrs[resourceapi.QualifiedName(intern(string(name)))] = t.shareAttribute(attr)
		}
		d.Attributes = attrs
	}
	if len(d.Capacity) > 0 {
		d.Capacity = t.shareEncoded("capacity", &resourceapi.Device{Capacity: d.Capacity}, d.Capacity).(map[resourceapi.QualifiedName]resourceapi.DeviceCapacity)
	}
	if len(d.ConsumesCounters) > 0 {
		d.ConsumesCounters = t.shareEncoded("consumes", &resourceapi.Device{ConsumesCounters: d.ConsumesCounters}, d.ConsumesCounters).([]resourceapi.DeviceCounterConsumption)
	}
}

// shareAttribute shares an attribute's value: strings by content, numbers
// and booleans by pointer.
func (t *table) shareAttribute(a resourceapi.DeviceAttribute) resourceapi.DeviceAttribute {
	switch {
	case a.StringValue != nil:
		*a.StringValue = intern(*a.StringValue)
	case a.VersionValue != nil:
		*a.VersionValue = intern(*a.VersionValue)
	case a.BoolValue != nil:
		a.BoolValue = sharedBool(*a.BoolValue)
	case a.IntValue != nil:
		a.IntValue = t.share("int\x00"+strconv.FormatInt(*a.IntValue, 10), a.IntValue).(*int64)
	}
	return a
}

func (t *table) shareCounters(c map[string]resourceapi.Counter) map[string]resourceapi.Counter {
	if len(c) == 0 {
		return c
	}
	return t.shareEncoded("counters", &resourceapi.CounterSet{Counters: c}, c).(map[string]resourceapi.Counter)
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
func (t *table) shareEncoded(kind string, enc marshaller, part any) any {
	b, err := enc.Marshal()
	if err != nil {
		return part
	}
	return t.share(kind+"\x00"+string(b), part)
}
