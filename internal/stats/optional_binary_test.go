package stats

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"reflect"
	"testing"
)

// appendOptional writes s in the form DecodeOptionalBinary reads (that of
// the pserver's kpss-v1 snapshots and the detector's checkpoints of versions
// 2 to 6): each histogram behind a presence byte.
func appendOptional(b []byte, s *Summary, hist, tail bool) []byte {
	b, _ = s.Moments.AppendBinary(b)
	for _, p := range []struct {
		on bool
		v  interface{ AppendBinary([]byte) ([]byte, error) }
	}{{hist, &s.Histogram}, {tail, &s.Tail}} {
		if !p.on {
			b = append(b, 0)
			continue
		}
		b = append(b, 1)
		b, _ = p.v.AppendBinary(b)
	}
	return binary.AppendUvarint(b, s.Anomalies)
}

func TestSummaryDecodeOptionalBinary(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	full := summaryOf(randomValues(rng, 500), 3)
	tests := []struct {
		name       string
		s          Summary
		hist, tail bool
		want       Summary
	}{
		{"both present", full, true, true, full},
		{"histogram absent", full, false, true, Summary{Moments: full.Moments, Tail: full.Tail, Anomalies: full.Anomalies}},
		{"tail absent", full, true, false, Summary{Moments: full.Moments, Histogram: full.Histogram, Anomalies: full.Anomalies}},
		{"moments and anomalies only", full, false, false, Summary{Moments: full.Moments, Anomalies: full.Anomalies}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := appendOptional(nil, &tc.s, tc.hist, tc.tail)
			b = append(b, "after"...)
			got := Summary{Anomalies: 99, Tail: TailHist{Lo: 3}}
			n, err := got.DecodeOptionalBinary(b)
			if err != nil {
				t.Fatal(err)
			}
			if n != len(b)-len("after") {
				t.Fatalf("took %d bytes of %d", n, len(b)-len("after"))
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("decoded %+v, want %+v", got, tc.want)
			}
			for i := range n {
				var p Summary
				if _, err := p.DecodeOptionalBinary(b[:i]); err == nil {
					t.Fatalf("prefix of %d of %d bytes accepted", i, n)
				}
				if !reflect.DeepEqual(p, Summary{}) {
					t.Fatalf("refused prefix of %d bytes left %+v", i, p)
				}
			}
		})
	}
	// a presence byte other than 0 and 1 is refused
	var s Summary
	if _, err := s.DecodeOptionalBinary([]byte{0, 2, 0, 0}); err == nil {
		t.Fatal("presence byte 2 accepted")
	}
}

func FuzzSummaryDecodeOptional(f *testing.F) {
	rng := rand.New(rand.NewPCG(13, 14))
	s := summaryOf(randomValues(rng, 50), 2)
	f.Add(appendOptional(nil, &s, true, true))
	f.Add(appendOptional(nil, &s, false, true))
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Summary
		n, err := s.DecodeOptionalBinary(b)
		switch {
		case err != nil && !reflect.DeepEqual(s, Summary{}):
			t.Fatalf("refused form left %+v", s)
		case err != nil:
			return
		case n > len(b):
			t.Fatalf("took %d of %d bytes", n, len(b))
		case s.Histogram.Validate() != nil || s.Tail.Validate() != nil:
			t.Fatalf("decoded a malformed histogram: %+v", s)
		}
		// written again in that form, it reads back to the same summary
		// (compared in Summary's own form: NaN payloads compare by bits)
		e := appendOptional(nil, &s, !zeroHist(&s.Histogram), !reflect.DeepEqual(s.Tail, TailHist{}))
		var s2 Summary
		if m, err := s2.DecodeOptionalBinary(e); err != nil || m != len(e) {
			t.Fatalf("its form written again refused (%v) or not whole (%d of %d)", err, m, len(e))
		}
		own, _ := s.AppendBinary(nil)
		own2, _ := s2.AppendBinary(nil)
		if !bytes.Equal(own, own2) {
			t.Fatalf("read back %+v, want %+v", s2, s)
		}
	})
}

// zeroHist reports whether h is the zero value (to the bit).
func zeroHist(h *Histogram) bool {
	b, _ := h.AppendBinary(nil)
	return len(b) == 1
}
