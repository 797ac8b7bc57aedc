package cli

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/kipimo-hpc/kipimo/internal/frame"
)

// newFramesCmd builds `kipimo frames`, the parent of the tools that work on
// frame files. Each subcommand is built by its own newFramesXxxCmd function
// and listed in the AddCommand call below.
func newFramesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "frames",
		Short: "Inspect and convert frame files",
		Long: `Tools for frame files: a binary frame file is the plain concatenation of
binary frames (schemas/frame-binary.md); the JSON form is one frame per line
(schemas/frame.schema.json). "kipimo frames dump F | kipimo frames encode"
reproduces F byte for byte.`,
	}
	cmd.AddCommand(
		newFramesDumpCmd(),
		newFramesEncodeCmd(),
		newFramesConvertCmd(),
	)
	return cmd
}

func newFramesDumpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "dump FILE...",
		Short: "Print the frames of binary frame files as JSON lines",
		Long: `Dump decodes every frame of each binary frame FILE, in order, and prints it
on stdout as one JSON object per line. A damaged file stops the dump with an
error naming the file, the frame number and the byte offset.`,
		Example: `  kipimo frames dump run/rank-0.frames | head -1
  kipimo frames dump run/rank-0.frames | kipimo frames encode --out copy.frames`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out := bufio.NewWriterSize(cmd.OutOrStdout(), 1<<20)
			for _, path := range args {
				if err := dumpFile(out, path); err != nil {
					_ = out.Flush()
					return err
				}
			}
			if err := out.Flush(); err != nil {
				return fmt.Errorf("write dump: %w", err)
			}
			return nil
		},
	}
}

func dumpFile(out *bufio.Writer, path string) error {
	fh, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("dump: %w", err)
	}
	defer fh.Close()
	r := frame.NewReader(bufio.NewReaderSize(fh, 1<<20))
	var f frame.Frame
	var line []byte
	for {
		err := r.Next(&f)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("dump %s: frame %d (starting at byte %d): %w", path, r.Frames()+1, r.Offset(), err)
		}
		if line, err = frame.AppendJSON(line[:0], &f); err != nil {
			return fmt.Errorf("dump %s: frame %d: %w", path, r.Frames(), err)
		}
		line = append(line, '\n')
		if _, err := out.Write(line); err != nil {
			return fmt.Errorf("write dump: %w", err)
		}
	}
}

func newFramesEncodeCmd() *cobra.Command {
	var outPath string
	cmd := &cobra.Command{
		Use:   "encode [FILE...]",
		Short: "Encode JSON-lines frames as a binary frame file",
		Long: `Encode reads frames in their JSON form, one per line, from each FILE in turn or
from stdin when no FILE is given ("-" also means stdin), and writes them as
binary frames to stdout, or to the file named by --out. Blank lines are
skipped. A bad line stops the encoding with an error naming the input, the
line, the frame number and the byte offset.`,
		Example: `  kipimo frames dump a.frames | kipimo frames encode > b.frames   # b equals a
  kipimo frames encode --out run.frames frames.jsonl`,
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			var dst io.Writer = cmd.OutOrStdout()
			if outPath != "" {
				fh, cerr := os.Create(outPath)
				if cerr != nil {
					return fmt.Errorf("encode: %w", cerr)
				}
				defer func() {
					if cerr := fh.Close(); cerr != nil && err == nil {
						err = fmt.Errorf("encode: %w", cerr)
					}
					if err != nil {
						_ = os.Remove(outPath)
					}
				}()
				dst = fh
			}
			w := frame.NewWriter(dst)
			if len(args) == 0 {
				args = []string{"-"}
			}
			for _, path := range args {
				if err := encodeInput(cmd, w, path); err != nil {
					return err
				}
			}
			if err := w.Flush(); err != nil {
				return fmt.Errorf("encode: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&outPath, "out", "o", "", "write the binary frames to this file instead of stdout")
	return cmd
}

// encodeInput encodes the JSON lines of one input ("-" is stdin).
func encodeInput(cmd *cobra.Command, w *frame.Writer, path string) error {
	name := path
	var in io.Reader
	if path == "-" {
		name, in = "stdin", cmd.InOrStdin()
	} else {
		fh, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("encode: %w", err)
		}
		defer fh.Close()
		in = fh
	}
	br := bufio.NewReaderSize(in, 1<<20)
	var f frame.Frame
	var buf []byte
	lineNo, frames := 0, 0
	offset := int64(0) // input offset of the current line
	for {
		line, err := readLine(br, buf[:0])
		buf = line
		if len(line) == 0 && err == io.EOF {
			return nil
		}
		if err != nil && err != io.EOF {
			return fmt.Errorf("encode: read %s: %w", name, err)
		}
		lineNo++
		start := offset
		offset += int64(len(line))
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		frames++
		if derr := frame.DecodeJSON(line, &f); derr != nil {
			var de *frame.DecodeError
			at := start
			if errors.As(derr, &de) {
				at += int64(de.Offset)
			}
			return fmt.Errorf("encode %s: line %d (frame %d), byte %d of the input: %w", name, lineNo, frames, at, derr)
		}
		if werr := w.Write(&f); werr != nil {
			return fmt.Errorf("encode %s: line %d (frame %d): %w", name, lineNo, frames, werr)
		}
		if err == io.EOF {
			return nil
		}
	}
}

// readLine appends the next line of br, newline included, to buf. It returns
// io.EOF with the last line when the input does not end in a newline.
func readLine(br *bufio.Reader, buf []byte) ([]byte, error) {
	for {
		chunk, err := br.ReadSlice('\n')
		buf = append(buf, chunk...)
		if err != bufio.ErrBufferFull {
			return buf, err
		}
	}
}
