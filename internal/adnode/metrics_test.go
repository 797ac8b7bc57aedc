package adnode

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kipimo-hpc/kipimo/internal/ad"
	"github.com/kipimo-hpc/kipimo/internal/frame"
)

func TestCollectorLimitsRankLabels(t *testing.T) {
	coll := NewCollector(2, func() uint64 { return 7 })
	for r := uint32(0); r < 4; r++ {
		d, err := ad.New(ad.Config{Rank: r, Algorithm: ad.SSTD})
		if err != nil {
			t.Fatal(err)
		}
		f := &frame.Frame{Rank: r, Events: []frame.FuncEvent{en(0, 1, 1), ex(0, 1, 5), ex(0, 2, 6)}}
		nameAll(f)
		if err := d.Process(context.Background(), f); err != nil {
			t.Fatal(err)
		}
		coll.Add(d)
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(coll); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "kipimo_ad_") {
			t.Errorf("metric %s lacks the kipimo_ad_ prefix", mf.GetName())
		}
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			got[key] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	want := map[string]float64{
		"kipimo_ad_frames_total{rank=0}":              1,
		"kipimo_ad_frames_total{rank=1}":              1,
		"kipimo_ad_frames_total{rank=other}":          2,
		"kipimo_ad_unmatched_exits_total{rank=0}":     1,
		"kipimo_ad_unmatched_exits_total{rank=other}": 2,
		"kipimo_ad_sink_dropped_records_total":        7,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if _, ok := got["kipimo_ad_frames_total{rank=2}"]; ok {
		t.Error("rank 2 has its own label beyond the limit of 2")
	}
}

func TestRejectsForeignAndMalformedFrames(t *testing.T) {
	tests := []struct {
		name string
		f    frame.Frame
		msg  string
	}{
		{"other rank", frame.Frame{Rank: 9}, "rank 9"},
		{"bad event kind", frame.Frame{Events: []frame.FuncEvent{{Kind: 7}}}, "kind 7"},
		{"huge function id", frame.Frame{Events: []frame.FuncEvent{{FID: 1 << 30}}}, "function id"},
		{"bad comm kind", frame.Frame{Comms: []frame.CommEvent{{Kind: 3}}}, "send or recv"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := ad.New(ad.Config{})
			if err != nil {
				t.Fatal(err)
			}
			err = d.Process(context.Background(), &tc.f)
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %v, want one mentioning %q", err, tc.msg)
			}
			if s := d.Stats(); s.BadFrames != 1 || s.Frames != 0 {
				t.Fatalf("counts %+v", s)
			}
		})
	}
}
