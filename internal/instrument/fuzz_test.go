package instrument

import (
	"bytes"
	"encoding/binary"
	"io"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

func FuzzParseInjection(f *testing.F) {
	for _, s := range []string{"MPI_Send:0.004:25ms", "ns::f(int):1:1s", "f:0:1ms", "f:1.5:1ms", ":0.1:1ms", "f:0.1:", "f::", "", "a:b:c:d",
		"compute:0.05:20ms@2", "f:1:1ms@0-1+6", "f@x:1:1ms", "f:1:1ms@", "f:1:1ms@3-1", "f:1:1ms@1++2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		in, err := ParseInjection(s)
		if err != nil {
			return
		}
		if in.Func == "" || in.Prob <= 0 || in.Prob > 1 || in.Delay <= 0 {
			t.Fatalf("%q parsed to %+v", s, in)
		}
		// What String prints parses back to the same injection.
		again, err := ParseInjection(in.String())
		if err != nil || !reflect.DeepEqual(again, in) {
			t.Fatalf("%q -> %+v -> %q -> %+v, %v", s, in, in.String(), again, err)
		}
	})
}

// harness runs testdata/fuzzharness.c: the library's own parsers (URL,
// durations, injection lists, the NATS server's protocol lines, the UTF-8
// repair of names) under AddressSanitizer and UBSan.
type harness struct {
	mu   sync.Mutex
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  io.Reader
	errb *bytes.Buffer
}

var (
	harnessOnce sync.Once
	harnessBin  string
	harnessErr  error
)

func startHarness(t testing.TB) *harness {
	t.Helper()
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("no C compiler")
	}
	harnessOnce.Do(func() {
		harnessBin = filepath.Join(libCache, "fuzzharness")
		out, err := exec.Command("cc", "-std=gnu11", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
			"-Wno-format-truncation", "-pthread", "-o", harnessBin, filepath.Join("testdata", "fuzzharness.c"), "-ldl").CombinedOutput()
		if err != nil {
			harnessErr = err
			harnessBin = string(out)
		}
	})
	if harnessErr != nil {
		t.Fatalf("build the fuzz harness: %v\n%s", harnessErr, harnessBin)
	}
	h := &harness{errb: &bytes.Buffer{}}
	h.cmd = exec.Command(harnessBin)
	h.cmd.Env = []string{"ASAN_OPTIONS=detect_leaks=0"}
	h.cmd.Stderr = h.errb
	var err error
	if h.in, err = h.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	h.out = out
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.in.Close()
		done := make(chan struct{})
		go func() { h.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			h.cmd.Process.Kill()
		}
	})
	return h
}

// run sends one input and returns the harness's answer, failing the test
// with the sanitizer's report if it died.
func (h *harness) run(t *testing.T, input []byte) []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(input)))
	if _, err := h.in.Write(append(n[:], input...)); err != nil {
		h.cmd.Wait()
		t.Fatalf("input %q: the harness died: %v\n%s", input, err, h.errb.String())
	}
	if _, err := io.ReadFull(h.out, n[:]); err != nil {
		h.cmd.Wait()
		t.Fatalf("input %q: the harness died: %v\n%s", input, err, h.errb.String())
	}
	out := make([]byte, binary.LittleEndian.Uint32(n[:]))
	if _, err := io.ReadFull(h.out, out); err != nil {
		t.Fatalf("input %q: short answer: %v", input, err)
	}
	return out
}

func FuzzLibraryParsers(f *testing.F) {
	seeds := []string{
		"\x00nats://127.0.0.1:4222", "\x00nats://user:pa:ss@host:1,other:2", "\x00tok@[::1]:4222/x", "\x00", "\x00@", "\x00[",
		"\x011s", "\x01250ms", "\x010.5", "\x01-1s", "\x011e400", "\x01nan", "\x01inf",
		"\x02MPI_Send:0.004:25ms,ns::f:1:1s", "\x02::,:", "\x02a:2:1s", "\x02compute:0.05:20ms@2,f:1:1s@0-1+6", "\x02f:1:1s@", "\x02f:1:1s@99999999999", "\x02f:1:1s@1-", "\x02f:1:1s@+", "\x02f@1:1:1s", "\x02" + strings.Repeat("f:0.1:1ms,", 50),
		"\x03INFO {\"max_payload\":1048576}\r\nPING\r\nPONG\r\n", "\x03INFO {\"tls_required\":true}\r\nPING\r\n",
		"\x03-ERR 'Authorization Violation'\r\n", "\x03" + strings.Repeat("PING\r\n", 100), "\x03" + strings.Repeat("x", 9000) + "\r\nPING\r\n",
		"\x03PI\x00NG\r\n\r\n\r", "\x04main", "\x04\xff\xfe", "\x04\xed\xa0\x80", "\x04\xf4\x90\x80\x80", "\x04caf\xc3", "\x04\xe2\x82\xac ok",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	h := startHarness(f)
	f.Fuzz(func(t *testing.T, input []byte) {
		if len(input) > 1<<19 {
			return
		}
		out := h.run(t, input)
		if len(input) > 0 && input[0]%5 == 4 {
			// The name as a frame writes it: a uvarint length and valid UTF-8.
			l, k := binary.Uvarint(out)
			if k <= 0 || uint64(len(out)-k) != l || !utf8.Valid(out[k:]) {
				t.Fatalf("name %q encoded as %q: want a length and valid UTF-8", input[1:], out)
			}
			// Names are C strings: they end at the first NUL.
			name, _, _ := bytes.Cut(input[1:], []byte{0})
			if utf8.Valid(name) && string(out[k:]) != string(name) {
				t.Fatalf("valid name %q changed to %q", name, out[k:])
			}
		}
	})
}
