package taudb

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/format/tauprofile"
)

// MetricNameKey is the metadata key naming a profile file's metric; it is
// always the first attribute TAU writes.
const MetricNameKey = tauprofile.MetricNameKey

// appendMetadataXML writes attrs as TAU's TauXML does, on one line.
func appendMetadataXML(b []byte, attrs []Attribute) []byte {
	b = append(b, "<metadata>"...)
	for _, a := range attrs {
		b = append(b, "<attribute><name>"...)
		b = appendXMLString(b, a.Name)
		b = append(b, "</name>"...)
		if a.Context != nil {
			b = append(b, "<timer_context>"...)
			b = appendXMLString(b, *a.Context)
			b = append(b, "</timer_context><call_number>"...)
			b = appendXMLString(b, a.CallNumber)
			b = append(b, "</call_number><timestamp>"...)
			b = appendXMLString(b, a.Timestamp)
			b = append(b, "</timestamp>"...)
		}
		b = append(b, "<value>"...)
		b = appendXMLString(b, a.Value)
		b = append(b, "</value></attribute>"...)
	}
	return append(b, "</metadata>"...)
}

// appendXMLString is Tau_XML_writeString: CDATA when the text has '<' or '&'
// and neither "]]>" nor a newline, otherwise entity escapes. A carriage
// return, which TAU does not expect in metadata, is written as "&#xd;" so
// that XML line-end handling cannot turn it into a newline.
func appendXMLString(b []byte, s string) []byte {
	if strings.ContainsAny(s, "<&") && !strings.Contains(s, "]]>") && !strings.ContainsAny(s, "\n\r") {
		b = append(b, "<![CDATA["...)
		b = append(b, s...)
		return append(b, "]]>"...)
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '&':
			b = append(b, "&amp;"...)
		case '"':
			b = append(b, "&quot;"...)
		case '\'':
			b = append(b, "&apos;"...)
		case '\n':
			b = append(b, "&#xa;"...)
		case '\r':
			b = append(b, "&#xd;"...)
		case '<':
			b = append(b, "&lt;"...)
		case '>':
			b = append(b, "&gt;"...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// SplitMetadata divides the real threads' metadata the way TAU's loader does:
// thread 0's keys are trial-level (primary) unless another thread has the key
// with a different value; keys that differ, or that thread 0 lacks, become
// one secondary row per thread that has them. Names and values are trimmed;
// context metadata (with a timer context) is not stored, as TAU's loader
// cannot store it either. It replaces tr.PrimaryMetadata and
// tr.SecondaryMetadata, then appends extra as further primary rows (TAU adds
// "File Type Index" and "File Type Name").
func (tr *Trial) SplitMetadata(extra ...Attribute) {
	threads := tr.RealThreads()
	type kv = map[string]string
	per := make([]kv, len(threads))
	var order []string
	seen := map[string]bool{}
	for i, th := range threads {
		per[i] = kv{}
		for _, a := range th.Metadata {
			if a.Context != nil || a.Name == MetricNameKey {
				continue
			}
			n := javaTrim(a.Name)
			per[i][n] = javaTrim(a.Value)
			if !seen[n] {
				seen[n] = true
				order = append(order, n)
			}
		}
	}
	tr.PrimaryMetadata = nil
	tr.SecondaryMetadata = nil
	var secondary []string
	for _, n := range order {
		primary := len(per) > 0
		if primary {
			v0, ok := per[0][n]
			if !ok {
				primary = false
			}
			for _, m := range per[1:] {
				if v, ok := m[n]; ok && v != v0 {
					primary = false
				}
			}
			if primary {
				tr.PrimaryMetadata = append(tr.PrimaryMetadata, Attribute{Name: n, Value: v0})
			}
		}
		if !primary {
			secondary = append(secondary, n)
		}
	}
	for _, n := range secondary {
		for i, th := range threads {
			if v, ok := per[i][n]; ok {
				tr.SecondaryMetadata = append(tr.SecondaryMetadata, &SecondaryMetadata{ID: NewUUID(), Thread: th, Name: n, Value: v})
			}
		}
	}
	tr.PrimaryMetadata = append(tr.PrimaryMetadata, extra...)
}

// LoaderMetadata is the primary metadata TAU's loader adds for TAU profiles.
func LoaderMetadata() []Attribute {
	return []Attribute{{Name: "File Type Index", Value: "1"}, {Name: "File Type Name", Value: "TAU profiles"}}
}

// AddJSONMetadata flattens a JSON object into trial metadata as TAU's
// loader does with -m: top-level scalars become primary rows; objects and
// arrays become nested secondary rows (parent links, is_array for arrays).
func (tr *Trial) AddJSONMetadata(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var top map[string]any
	if err := dec.Decode(&top); err != nil {
		return fmt.Errorf("metadata JSON: want one object: %w", err)
	}
	keys := make([]string, 0, len(top))
	for k := range top {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		switch v := top[k].(type) {
		case map[string]any, []any:
			tr.addNestedMetadata(nil, k, v)
		default:
			tr.PrimaryMetadata = append(tr.PrimaryMetadata, Attribute{Name: k, Value: jsonScalar(v)})
		}
	}
	return nil
}

func (tr *Trial) addNestedMetadata(parent *SecondaryMetadata, name string, v any) {
	row := &SecondaryMetadata{ID: NewUUID(), Parent: parent, Name: name}
	tr.SecondaryMetadata = append(tr.SecondaryMetadata, row)
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			tr.addNestedMetadata(row, k, v[k])
		}
	case []any:
		row.IsArray = true
		for i, e := range v {
			tr.addNestedMetadata(row, fmt.Sprint(i), e)
		}
	default:
		row.Value = jsonScalar(v)
	}
}

func jsonScalar(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	default:
		return fmt.Sprint(v)
	}
}

// NewUUID returns a random (version 4) UUID string, the form TAU uses for
// secondary_metadata ids.
func NewUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
