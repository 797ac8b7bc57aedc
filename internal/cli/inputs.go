package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kipimo-hpc/kipimo/internal/replay"
	"github.com/kipimo-hpc/kipimo/internal/workload"
)

// matchInputs lists the files the input arguments name: a file as itself, a
// directory as the regular files in it (not hidden, sorted; the reader of
// the format says what an empty one lacks). A path that does not exist is an
// error naming it.
func matchInputs(args []string) ([]string, error) {
	var out []string
	for _, a := range args {
		st, err := os.Stat(a)
		if err != nil {
			return nil, fmt.Errorf("input %s: %w", a, err)
		}
		if !st.IsDir() {
			out = append(out, a)
			continue
		}
		entries, err := os.ReadDir(a)
		if err != nil {
			return nil, fmt.Errorf("input %s: %w", a, err)
		}
		var in []string
		for _, e := range entries {
			if e.Type().IsRegular() && !strings.HasPrefix(e.Name(), ".") {
				in = append(in, filepath.Join(a, e.Name()))
			}
		}
		sort.Strings(in)
		out = append(out, in...)
	}
	return out, nil
}

// reportInputs writes one line saying which files the arguments matched
// (the first few by name), so that a glob or a directory that matched
// something unexpected shows before the work starts.
func reportInputs(w io.Writer, args []string) error {
	files, err := matchInputs(args)
	if err != nil {
		return err
	}
	const show = 4
	names := files
	more := ""
	if len(names) > show {
		names, more = names[:show], fmt.Sprintf(" and %d more", len(files)-show)
	}
	noun := "files"
	if len(files) == 1 {
		noun = "file"
	}
	_, err = fmt.Fprintf(w, "input: %d %s: %s%s\n", len(files), noun, strings.Join(names, ", "), more)
	return err
}

// inputFormat is the trace format of input files and directories given
// without --format, from their names (workload.DetectFormat): all of them
// must tell the same one.
func inputFormat(inputs []string) (string, error) {
	format, first := "", ""
	for _, in := range inputs {
		f, err := workload.DetectFormat(in)
		if err != nil {
			return "", fmt.Errorf("%w: give --format (one of %s); to run a program, give --exec -- COMMAND", err, strings.Join(replay.Formats, ", "))
		}
		if format != "" && f != format {
			return "", fmt.Errorf("the inputs are of different formats by their names (%s: %s, %s: %s): give --format", first, format, in, f)
		}
		format, first = f, in
	}
	return format, nil
}
