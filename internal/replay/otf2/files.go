package otf2

import (
	"fmt"
	"io"
)

// maxOpenFiles bounds the event files held open at once while the locations
// are merged: archives of thousands of locations would exceed the process's
// file limit. A file closed to make room is reopened where it was.
var maxOpenFiles = 256

// filePool keeps at most max lazyFiles open, closing the least recently
// read.
type filePool struct {
	open func(string) (io.ReadCloser, error)
	max  int
	live []*lazyFile
	tick uint64
}

// lazyFile is an event file read sequentially, opened on demand.
type lazyFile struct {
	pool *filePool
	path string
	off  int64
	rc   io.ReadCloser
	used uint64
}

func (p *filePool) file(path string) *lazyFile { return &lazyFile{pool: p, path: path} }

func (f *lazyFile) Read(b []byte) (int, error) {
	p := f.pool
	if f.rc == nil {
		if len(p.live) >= p.max {
			old := 0
			for i, o := range p.live {
				if o.used < p.live[old].used {
					old = i
				}
			}
			p.live[old].Close()
		}
		rc, err := p.open(f.path)
		if err != nil {
			if f.off == 0 {
				return 0, err
			}
			return 0, fmt.Errorf("reopen %s: %w", f.path, err)
		}
		if f.off > 0 {
			var err error
			if s, ok := rc.(io.Seeker); ok {
				_, err = s.Seek(f.off, io.SeekStart)
			} else {
				_, err = io.CopyN(io.Discard, rc, f.off)
			}
			if err != nil {
				rc.Close()
				return 0, fmt.Errorf("reopen %s at byte offset %d: %w", f.path, f.off, err)
			}
		}
		f.rc = rc
		p.live = append(p.live, f)
	}
	p.tick++
	f.used = p.tick
	n, err := f.rc.Read(b)
	f.off += int64(n)
	return n, err
}

// Close closes the file if it is open; a later Read reopens it.
func (f *lazyFile) Close() error {
	if f.rc == nil {
		return nil
	}
	err := f.rc.Close()
	f.rc = nil
	p := f.pool
	for i, o := range p.live {
		if o == f {
			p.live = append(p.live[:i], p.live[i+1:]...)
			break
		}
	}
	return err
}
