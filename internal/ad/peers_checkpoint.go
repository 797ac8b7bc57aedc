package ad

import "github.com/kipimo-hpc/kipimo/internal/syncproto"

// peer writes a step summary's peer data (checkpoint version 6 on): a
// flag, then the step's times, its functions and its waits.
func (w *ckWriter) peer(p *syncproto.PeerStep) {
	w.Bool(p != nil)
	if p == nil {
		return
	}
	w.Uvarint(p.Start)
	w.Uvarint(p.End)
	optLen(w, p.Funcs)
	for _, f := range p.Funcs {
		w.Str(f.Func)
		w.Str(f.Kind)
		w.Uvarint(f.Us)
		w.Uvarint(f.Calls)
		w.Uvarint(f.MaxUs)
	}
	optLen(w, p.Waits)
	for _, x := range p.Waits {
		w.U32(x.Partner)
		w.Uvarint(x.Us)
	}
}

// peer reads what ckWriter.peer wrote.
func (r *ckReader) peer() *syncproto.PeerStep {
	if !r.Bool() {
		return nil
	}
	p := &syncproto.PeerStep{Start: r.Uvarint(), End: r.Uvarint()}
	p.Funcs = optMake[syncproto.PeerFunc](r.optCount(5))
	for i := range p.Funcs {
		f := &p.Funcs[i]
		f.Func, f.Kind = r.Str(), r.Str()
		f.Us, f.Calls, f.MaxUs = r.Uvarint(), r.Uvarint(), r.Uvarint()
	}
	p.Waits = optMake[syncproto.PeerWait](r.optCount(2))
	for i := range p.Waits {
		p.Waits[i] = syncproto.PeerWait{Partner: r.U32(), Us: r.Uvarint()}
	}
	return p
}
