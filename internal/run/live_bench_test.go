package run

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/kipimo-hpc/kipimo/internal/instrument"
	"github.com/kipimo-hpc/kipimo/internal/natsx"
)

// loopSeconds reads LAMMPS's "Loop time of S on N procs" line.
func loopSeconds(out string) float64 {
	i := strings.Index(out, "Loop time of ")
	if i < 0 {
		return 0
	}
	f := strings.Fields(out[i+len("Loop time of "):])
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// BenchmarkLAMMPS runs Debian's lmp on 2 ranks (4,000 atoms, 2,000 steps)
// alone, with the event library only (its frames going to a NATS server
// that discards them: the library's own cost), and under `kipimo run --exec`
// (the library in both ranks and the whole pipeline on the same cores). wall-s is the command's wall
// time (for kipimo, from its start to its exit, as the pipeline measures
// it); loop-s is LAMMPS's own timing of its MD loop.
func BenchmarkLAMMPS(b *testing.B) {
	for _, tool := range []string{"cc", "mpicc", "mpirun", "lmp"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("%s not found", tool)
		}
	}
	b.Setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
	b.Setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
	input, err := filepath.Abs("../instrument/testdata/lj.in")
	if err != nil {
		b.Fatal(err)
	}
	args := []string{"mpirun", "-np", "2", "lmp", "-in", input, "-log", "none", "-var", "steps", "2000"}
	cache := b.TempDir()
	if _, err := instrument.Build(context.Background(), instrument.BuildOptions{CacheDir: cache, MPI: true}); err != nil {
		b.Fatal(err)
	}
	b.Run("alone", func(b *testing.B) {
		var loop, wall float64
		for b.Loop() {
			t0 := time.Now()
			out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
			wall += time.Since(t0).Seconds()
			if err != nil {
				b.Fatalf("lmp: %v\n%s", err, out)
			}
			loop += loopSeconds(string(out))
		}
		b.ReportMetric(wall/float64(b.N), "wall-s")
		b.ReportMetric(loop/float64(b.N), "loop-s")
	})
	b.Run("library", func(b *testing.B) {
		lib, err := instrument.Build(context.Background(), instrument.BuildOptions{CacheDir: cache, MPI: true})
		if err != nil {
			b.Fatal(err)
		}
		scfg := natsx.DefaultServerConfig(b.TempDir())
		scfg.JetStream = false
		ns, err := natsx.StartServer(scfg)
		if err != nil {
			b.Fatal(err)
		}
		defer ns.Shutdown()
		nc, err := nats.Connect(ns.ClientURL())
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		if _, err := nc.Subscribe("kipimo.bench.frames.>", func(*nats.Msg) {}); err != nil {
			b.Fatal(err)
		}
		env := lib.Environ(instrument.Env{NATSURL: ns.ClientURL(), Run: "bench"}, os.Environ())
		var loop, wall float64
		for b.Loop() {
			cmd := exec.Command(args[0], args[1:]...)
			cmd.Env = env
			t0 := time.Now()
			out, err := cmd.CombinedOutput()
			wall += time.Since(t0).Seconds()
			if err != nil {
				b.Fatalf("lmp: %v\n%s", err, out)
			}
			loop += loopSeconds(string(out))
		}
		b.ReportMetric(wall/float64(b.N), "wall-s")
		b.ReportMetric(loop/float64(b.N), "loop-s")
	})
	b.Run("kipimo", func(b *testing.B) {
		var loop, wall, events float64
		for b.Loop() {
			var out bytes.Buffer
			cfg := Config{Out: b.TempDir(), RunID: "bench", Live: LiveConfig{
				Command: args, Build: instrument.BuildOptions{CacheDir: cache}, Stdout: &out, Stderr: &out,
			}}
			ctx := context.Background()
			p, err := Start(ctx, cfg, zerolog.Nop())
			if err != nil {
				b.Fatal(err)
			}
			sum, err := p.Execute(ctx, nil)
			p.Close(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if sum.Live.ExitCode != 0 {
				b.Fatalf("lmp under kipimo: status %d\n%s", sum.Live.ExitCode, out.String())
			}
			wall += sum.Live.CommandSeconds
			loop += loopSeconds(out.String())
			events += float64(sum.Events)
		}
		b.ReportMetric(wall/float64(b.N), "wall-s")
		b.ReportMetric(loop/float64(b.N), "loop-s")
		b.ReportMetric(events/wall, "events/s")
	})
}
