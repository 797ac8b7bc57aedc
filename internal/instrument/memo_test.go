package instrument

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// A second Build with the same options and command answers from the memo
// without running ldd (or a compiler) again, and returns the same library;
// once the program changes, Build looks at it again.
func TestBuildRemembersItsResult(t *testing.T) {
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("no C compiler")
	}
	realLDD, err := exec.LookPath("ldd")
	if err != nil {
		t.Skip("no ldd")
	}
	dir := t.TempDir()
	prog := filepath.Join(dir, "prog")
	b, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Skip(err)
	}
	if err := os.WriteFile(prog, b, 0o755); err != nil {
		t.Fatal(err)
	}
	// ldd, counted: Build asks it which libraries the program loads.
	bin := filepath.Join(dir, "bin")
	log := filepath.Join(dir, "ldd.log")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\necho \"$@\" >> " + log + "\nexec " + realLDD + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "ldd"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	calls := func() int {
		b, _ := os.ReadFile(log)
		return strings.Count(string(b), "\n")
	}
	opts := BuildOptions{CacheDir: libCache, Command: []string{prog, "--flag"}}
	first, err := Build(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	n := calls()
	if n == 0 {
		t.Fatal("Build never ran ldd on the program: the test cannot tell the memo from the work")
	}
	for i := 0; i < 2; i++ {
		again, err := Build(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(again, first) {
			t.Fatalf("the memo returned %+v, the build %+v", again, first)
		}
		if calls() != n {
			t.Fatalf("Build %d with the same inputs ran ldd %d more times", i+2, calls()-n)
		}
	}
	// The program changes: its libraries may too.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(prog, later, later); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	if calls() == n {
		t.Error("Build answered from the memo after the program changed")
	}
	// Another command is another memo.
	n = calls()
	if _, err := Build(context.Background(), BuildOptions{CacheDir: libCache, Command: []string{prog}}); err != nil {
		t.Fatal(err)
	}
	if calls() == n {
		t.Error("Build answered another command from this one's memo")
	}
}
