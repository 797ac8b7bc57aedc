package ad

import "github.com/kipimo-hpc/kipimo/internal/psync"

// peer writes a step summary's peer data (checkpoint version 6 on): a
// flag, then the step's times, its functions and its waits.
func (w *ckWriter) peer(p *psync.PeerStep) {
	w.bool(p != nil)
	if p == nil {
		return
	}
	w.uvarint(p.Start)
	w.uvarint(p.End)
	optLen(w, p.Funcs)
	for _, f := range p.Funcs {
		w.str(f.Func)
		w.str(f.Kind)
		w.uvarint(f.Us)
		w.uvarint(f.Calls)
		w.uvarint(f.MaxUs)
	}
	optLen(w, p.Waits)
	for _, x := range p.Waits {
		w.u32(x.Partner)
		w.uvarint(x.Us)
	}
}

// peer reads what ckWriter.peer wrote.
func (r *ckReader) peer() *psync.PeerStep {
	if !r.bool() {
		return nil
	}
	p := &psync.PeerStep{Start: r.uvarint(), End: r.uvarint()}
	p.Funcs = optMake[psync.PeerFunc](r.optCount(5))
	for i := range p.Funcs {
		f := &p.Funcs[i]
		f.Func, f.Kind = r.str(), r.str()
		f.Us, f.Calls, f.MaxUs = r.uvarint(), r.uvarint(), r.uvarint()
	}
	p.Waits = optMake[psync.PeerWait](r.optCount(2))
	for i := range p.Waits {
		p.Waits[i] = psync.PeerWait{Partner: r.u32(), Us: r.uvarint()}
	}
	return p
}
