package sqlitestore

import "testing"

func TestRefs(t *testing.T) {
	for _, tc := range []struct {
		id   int64
		slot int
	}{{1, 0}, {127, 63}, {1 << 40, 5}} {
		ref := appendRef(nil, tc.id, tc.slot)
		id, slot, err := parseRef(ref)
		if err != nil || id != tc.id || slot != tc.slot {
			t.Errorf("ref(%d, %d): got %d, %d, %v", tc.id, tc.slot, id, slot, err)
		}
	}
	for name, doc := range map[string]string{
		"empty":         "",
		"plain JSON":    `{"a":1}`,
		"no slot":       "\x02\x05",
		"trailing data": "\x02\x05\x01\x00",
		"unknown":       "\x07\x01\x01",
		"overlong id":   "\x02\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x00",
	} {
		if _, _, err := parseRef([]byte(doc)); err == nil {
			t.Errorf("%s: parsed %q", name, doc)
		}
	}
}
