package frame

import (
	"fmt"
	"unicode/utf8"
)

// Validate reports the first value of f that neither encoding can carry: an
// event or comm kind other than 0 or 1, or a string that is not valid UTF-8.
// It does not check event order: timestamps may go backwards on a thread in
// both encodings (the detector decides what that means).
func (f *Frame) Validate() error {
	for i := range f.Funcs {
		if !utf8.ValidString(f.Funcs[i].Name) {
			return fmt.Errorf("funcs[%d].name: %w: not valid UTF-8", i, ErrInvalid)
		}
	}
	for i := range f.Counters {
		if !utf8.ValidString(f.Counters[i].Name) {
			return fmt.Errorf("counters[%d].name: %w: not valid UTF-8", i, ErrInvalid)
		}
	}
	for i := range f.Metadata {
		if !utf8.ValidString(f.Metadata[i].Key) {
			return fmt.Errorf("metadata[%d].key: %w: not valid UTF-8", i, ErrInvalid)
		}
		if !utf8.ValidString(f.Metadata[i].Value) {
			return fmt.Errorf("metadata[%d].value: %w: not valid UTF-8", i, ErrInvalid)
		}
	}
	if i := f.badEventKind(); i >= 0 {
		return fmt.Errorf("events[%d].kind: %w: kind %d (want 0 entry or 1 exit)", i, ErrInvalid, f.Events[i].Kind)
	}
	if i := f.badCommKind(); i >= 0 {
		return fmt.Errorf("comms[%d].kind: %w: kind %d (want 0 send or 1 recv)", i, ErrInvalid, f.Comms[i].Kind)
	}
	return nil
}

func (f *Frame) badEventKind() int {
	for i := range f.Events {
		if f.Events[i].Kind > Exit {
			return i
		}
	}
	return -1
}

func (f *Frame) badCommKind() int {
	for i := range f.Comms {
		if f.Comms[i].Kind > Recv {
			return i
		}
	}
	return -1
}
