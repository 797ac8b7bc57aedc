package otf2

import (
	"fmt"
	"io"
	"math"
	"os"
	"sort"
)

// Definition record ids (global definitions file; local files share the
// ids above 9 and use 5 and 6 for their own records).
const (
	defClockProperties = 5  // global
	defMappingTable    = 5  // local
	defClockOffset     = 6  // local
	defString          = 10 // both
	defLocationGroup   = 13
	defLocation        = 14
	defRegion          = 15
	defGroup           = 18
	defMetricMember    = 19
	defMetricClass     = 20
	defMetricInstance  = 21
	defComm            = 22
)

// Group types (OTF2_GroupType).
const (
	groupCommLocations = 4
	groupCommGroup     = 5
	groupCommSelf      = 6
)

// Location types (OTF2_LocationType).
const (
	locationCPUThread = 1
	locationGPU       = 2
	locationMetric    = 3
)

// Metric value types (OTF2_Type).
const (
	typeUint64 = 4
	typeInt64  = 8
	typeDouble = 10
)

// Mapping table types (OTF2_MappingType) this reader applies.
const (
	mapRegion = 3
	mapGroup  = 4
	mapMetric = 5
	mapComm   = 6
)

const undefined32 = math.MaxUint32

// Clock is the archive's timer: ticks per second and the timestamp all
// event times are at or after.
type Clock struct {
	Resolution uint64
	Offset     uint64
	Length     uint64
}

// LocationGroup is a process (or accelerator) of the archive.
type LocationGroup struct {
	ID      uint32
	Name    string
	Type    uint8
	Creator uint32 // creating location group (OTF2 3), or undefined
}

// Location is one event stream: a thread, a GPU stream or a metric source.
type Location struct {
	ID     uint64
	Name   string
	Type   uint8
	Events uint64 // number of events it recorded
	Group  uint32
}

// Group is a set of locations or ranks.
type Group struct {
	Type     uint8
	Paradigm uint8
	Members  []uint64
}

// Comm is a communicator: the group of its ranks.
type Comm struct {
	Name  string
	Group uint32
}

// MetricMember is one metric (a PAPI counter, a resource usage value...).
type MetricMember struct {
	Name, Unit string
	Type       uint8 // value type
}

// Metric is a metric class (or a metric instance, resolved to its class):
// the members whose values a Metric event carries, in order.
type Metric struct {
	Members []uint32
}

// Defs are the global definitions of an archive.
type Defs struct {
	Clock     Clock
	HasClock  bool
	Strings   map[uint32]string
	Groups    map[uint32]*LocationGroup // location groups
	Locations map[uint64]*Location
	Regions   map[uint32]uint32 // region → name string
	Sets      map[uint32]*Group // groups
	Comms     map[uint32]Comm
	Members   map[uint32]MetricMember
	Metrics   map[uint32]Metric
	// Records counts the definition records read.
	Records int
}

func (d *Defs) str(id uint32) string {
	if s, ok := d.Strings[id]; ok {
		return s
	}
	if id == undefined32 {
		return ""
	}
	return fmt.Sprintf("string %d", id)
}

// RegionName is the name of region id.
func (d *Defs) RegionName(id uint32) string {
	if s, ok := d.Regions[id]; ok {
		return d.str(s)
	}
	return fmt.Sprintf("region %d", id)
}

// SortedLocations returns the locations in id order.
func (d *Defs) SortedLocations() []*Location {
	out := make([]*Location, 0, len(d.Locations))
	for _, l := range d.Locations {
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

type metricClass struct {
	members []uint32
}

// ReadDefs reads the global definitions file path with the given chunk size.
func ReadDefs(path string, chunkSize int64) (*Defs, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("otf2 global definitions: %w", err)
	}
	defer fh.Close()
	return ParseDefs(fh, path, chunkSize)
}

// ParseDefs reads global definitions from r; name is for messages.
func ParseDefs(r io.Reader, name string, chunkSize int64) (*Defs, error) {
	d := &Defs{
		Strings: map[uint32]string{}, Groups: map[uint32]*LocationGroup{}, Locations: map[uint64]*Location{},
		Regions: map[uint32]uint32{}, Sets: map[uint32]*Group{}, Comms: map[uint32]Comm{},
		Members: map[uint32]MetricMember{}, Metrics: map[uint32]Metric{},
	}
	classes := map[uint32]metricClass{}
	instances := map[uint32]uint32{} // instance → class
	c := newChunkReader(name, r, chunkSize, 32<<10)
	for {
		id, err := c.next(false, nil)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		p, err := c.payload()
		if err != nil {
			return nil, err
		}
		d.Records++
		f := &dec{b: p, little: c.little}
		switch id {
		case defClockProperties:
			d.Clock = Clock{Resolution: f.u64("timer resolution"), Offset: f.u64("global offset"), Length: f.u64("trace length")}
			d.HasClock = true
		case defString:
			k := f.u32("id")
			d.Strings[k] = f.str("string")
		case defLocationGroup:
			g := &LocationGroup{ID: f.u32("id"), Creator: undefined32}
			g.Name = d.str(f.u32("name"))
			g.Type = f.u8("type")
			f.u32("system tree parent")
			if f.more() {
				g.Creator = f.u32("creating location group")
			}
			d.Groups[g.ID] = g
		case defLocation:
			l := &Location{ID: f.u64("id")}
			l.Name = d.str(f.u32("name"))
			l.Type = f.u8("type")
			l.Events = f.u64("number of events")
			l.Group = f.u32("location group")
			d.Locations[l.ID] = l
		case defRegion:
			k := f.u32("id")
			d.Regions[k] = f.u32("name")
		case defGroup:
			// Fields added by later versions come after the original
			// ones: the pre-1.2 group type stays in its place.
			k := f.u32("id")
			f.u32("name")
			f.u8("group type (before OTF2 1.2)")
			n := f.u32("number of members")
			if f.err == nil && uint64(n) > uint64(len(p)) {
				f.err = fmt.Errorf("group %d claims %d members in a %d-byte record", k, n, len(p))
			}
			g := &Group{}
			for i := uint32(0); i < n && f.err == nil; i++ {
				g.Members = append(g.Members, f.u64("members"))
			}
			if f.more() { // OTF2 1.2 and later
				g.Type, g.Paradigm = f.u8("group type"), f.u8("paradigm")
				f.u32("group flags")
			}
			d.Sets[k] = g
		case defMetricMember:
			k := f.u32("id")
			m := MetricMember{Name: d.str(f.u32("name"))}
			f.u32("description")
			f.u8("metric type")
			f.u8("metric mode")
			m.Type = f.u8("value type")
			f.u8("base")
			f.i64("exponent")
			m.Unit = d.str(f.u32("unit"))
			d.Members[k] = m
		case defMetricClass:
			k := f.u32("id")
			n := f.u8("number of metrics")
			mc := metricClass{}
			for i := 0; i < int(n) && f.err == nil; i++ {
				mc.members = append(mc.members, f.u32("metric members"))
			}
			classes[k] = mc
		case defMetricInstance:
			k := f.u32("id")
			instances[k] = f.u32("metric class")
		case defComm:
			k := f.u32("id")
			cm := Comm{Name: d.str(f.u32("name"))}
			cm.Group = f.u32("group")
			d.Comms[k] = cm
		}
		if f.err != nil {
			return nil, &Error{File: name, Offset: c.recOff, Err: fmt.Errorf("definition record %d: %w", id, f.err)}
		}
	}
	for k, mc := range classes {
		d.Metrics[k] = Metric{Members: mc.members}
	}
	for k, cl := range instances {
		if mc, ok := classes[cl]; ok {
			d.Metrics[k] = Metric{Members: mc.members}
		}
	}
	if !d.HasClock {
		return nil, &Error{File: name, Offset: c.off, Err: fmt.Errorf("no clock properties definition: timestamps cannot be converted to time")}
	}
	if d.Clock.Resolution == 0 {
		return nil, &Error{File: name, Offset: c.off, Err: fmt.Errorf("clock properties give a timer resolution of 0 ticks per second")}
	}
	return d, nil
}

// clockInterval corrects a location's clock between two clock offsets by
// linear interpolation, as OTF2's readers do.
type clockInterval struct {
	begin, end uint64
	offset     int64
	slope      float64
}

// Local is what a location's local definitions file says: mapping tables
// from its local ids to global ids, and clock offsets.
type Local struct {
	maps      map[uint8]map[uint64]uint64
	intervals []clockInterval
	cur       int
	// Records counts the definition records read.
	Records int
}

// Map translates a local id of the given mapping type to its global id.
func (l *Local) Map(kind uint8, id uint32) uint32 {
	if l == nil || l.maps[kind] == nil {
		return id
	}
	if g, ok := l.maps[kind][uint64(id)]; ok {
		return uint32(g)
	}
	return id
}

// Correct applies the clock offsets to a timestamp. Timestamps must come in
// non-decreasing order.
func (l *Local) Correct(t uint64) uint64 {
	if l == nil || len(l.intervals) == 0 {
		return t
	}
	for l.cur+1 < len(l.intervals) && t > l.intervals[l.cur].end {
		l.cur++
	}
	iv := l.intervals[l.cur]
	v := float64(t) + iv.slope*(float64(t)-float64(iv.begin)) + float64(iv.offset)
	if v <= 0 || math.IsNaN(v) {
		return 0
	}
	if v >= math.MaxUint64 {
		return math.MaxUint64
	}
	return uint64(math.RoundToEven(v))
}

// maxMapSize bounds the entries of one mapping table against its record.
func parseIDMap(f *dec, plen int) map[uint64]uint64 {
	n := f.u64("id map size")
	mode := f.u8("id map mode")
	if f.err == nil && n > uint64(plen) {
		f.err = fmt.Errorf("id map claims %d entries in a %d-byte record", n, plen)
		return nil
	}
	m := make(map[uint64]uint64, n)
	for i := uint64(0); i < n && f.err == nil; i++ {
		if mode == 0 { // dense
			m[i] = f.u64("id map")
			continue
		}
		k := f.u64("id map")
		m[k] = f.u64("id map")
	}
	return m
}

// ParseLocal reads a local definitions file from r.
func ParseLocal(r io.Reader, name string, chunkSize int64) (*Local, error) {
	l := &Local{maps: map[uint8]map[uint64]uint64{}}
	type offset struct {
		time   uint64
		offset int64
	}
	var offs []offset
	c := newChunkReader(name, r, chunkSize, 4<<10)
	for {
		id, err := c.next(false, nil)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		p, err := c.payload()
		if err != nil {
			return nil, err
		}
		l.Records++
		f := &dec{b: p, little: c.little}
		switch id {
		case defMappingTable:
			kind := f.u8("mapping type")
			m := parseIDMap(f, len(p))
			if f.err == nil {
				l.maps[kind] = m
			}
		case defClockOffset:
			t := f.u64full("time")
			o := f.i64("offset")
			f.full(8, "standard deviation")
			if f.err == nil {
				if n := len(offs); n > 0 && offs[n-1].time >= t {
					return nil, &Error{File: name, Offset: c.recOff, Err: fmt.Errorf("clock offset at time %d does not follow the one at %d", t, offs[n-1].time)}
				}
				offs = append(offs, offset{t, o})
			}
		}
		if f.err != nil {
			return nil, &Error{File: name, Offset: c.recOff, Err: fmt.Errorf("definition record %d: %w", id, f.err)}
		}
	}
	for i := 1; i < len(offs); i++ {
		a, b := offs[i-1], offs[i]
		l.intervals = append(l.intervals, clockInterval{
			begin: a.time, end: b.time, offset: a.offset,
			slope: (float64(b.offset) - float64(a.offset)) / (float64(b.time) - float64(a.time)),
		})
	}
	return l, nil
}
