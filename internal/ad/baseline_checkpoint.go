package ad

import "github.com/kipimo-hpc/kipimo/internal/provenance"

// The baseline comparison's part of a checkpoint (version 6 on): whether
// the detector compared with a baseline, which one (as named), and per
// model key the calls counted so far, those beyond the baseline's bound and
// whether its test was significant. A detector restored with the same
// --baseline goes on counting; one restored with another (or none) starts
// its counts afresh, since they were against another bound.

func (w *ckWriter) baseline(d *Detector) {
	w.Bool(d.base != nil)
	if d.base == nil {
		return
	}
	w.Str(d.base.ref.Source)
	w.Uvarint(uint64(len(d.base.keys)))
	for i := range d.base.keys {
		k := &d.base.keys[i]
		w.Uvarint(k.calls)
		w.Uvarint(k.beyond)
		w.Bool(k.sig)
	}
}

func (r *ckReader) baseline(d *Detector) {
	if !r.Bool() {
		return
	}
	source := r.Str()
	n := r.Count(3)
	keys := make([]baseKey, 0, n)
	for range n {
		keys = append(keys, baseKey{calls: r.Uvarint(), beyond: r.Uvarint(), sig: r.Bool()})
	}
	if r.Err != nil || d.base == nil || d.base.ref.Source != source {
		return
	}
	// Each key resolves its baseline key by name again on first use.
	d.base.keys = keys
}

// The baseline evidence of a pending record's explanation (version 6 on).

func (w *ckWriter) evidence(b *provenance.BaselineEvidence) {
	w.Bool(b != nil)
	if b == nil {
		return
	}
	w.Str(b.Source)
	w.F64(b.Bound)
	for _, v := range [...]uint64{b.BaselineCalls, b.BaselineBeyond, b.Calls, b.Beyond} {
		w.Uvarint(v)
	}
	w.F64(b.PValue)
}

func (r *ckReader) evidence() *provenance.BaselineEvidence {
	if !r.Bool() {
		return nil
	}
	b := &provenance.BaselineEvidence{Source: r.Str(), Bound: r.F64()}
	for _, p := range [...]*uint64{&b.BaselineCalls, &b.BaselineBeyond, &b.Calls, &b.Beyond} {
		*p = r.Uvarint()
	}
	b.PValue = r.F64()
	return b
}
