package workload

import (
	"path/filepath"

	"github.com/kipimo-hpc/kipimo/internal/replay"
)

// CorpusApps lists the families of the real-trace evaluation corpus kept
// under dir (the package's testdata/corpus, whose MANIFEST says where each
// trace comes from): one application per family, each a trace other
// projects' tools recorded (TAU, the PyTorch profiler, rocprofiler,
// Score-P, Caliper, Chrome). Three families are the evaluation traces of
// EvalApps, kept next to the corpus (dir/../eval).
func CorpusApps(dir string) []TraceApp {
	fam := func(name, format, path string) TraceApp {
		return TraceApp{Name: name, Files: []string{filepath.Join(dir, filepath.FromSlash(path))}, Format: format}
	}
	return []TraceApp{
		fam("kanika_phase1", replay.FormatTAU, "../eval/kanika_phase1"),
		fam("opencl_course_L5", replay.FormatTAU, "../eval/opencl_course_L5"),
		fam("pytorch_simple_add", replay.FormatChrome, "../eval/pytorch_simple_add"),
		fam("hecatoncheir", replay.FormatTAU, "hecatoncheir"),
		fam("hta_alexnet", replay.FormatChrome, "hta_alexnet"),
		fam("hta_cupti_profiler", replay.FormatChrome, "hta_cupti_profiler"),
		fam("hta_cuda_event_sync", replay.FormatChrome, "hta_cuda_event_sync"),
		fam("hta_cuda_event_sync_multi_stream", replay.FormatChrome, "hta_cuda_event_sync_multi_stream"),
		fam("hta_cpu_only", replay.FormatChrome, "hta_cpu_only"),
		fam("hta_rank_non_gpu", replay.FormatChrome, "hta_rank_non_gpu"),
		fam("hta_sampled_ranks", replay.FormatChrome, "hta_sampled_ranks"),
		fam("hta_mi250", replay.FormatChrome, "hta_mi250"),
		fam("pipit_ping_pong", replay.FormatOTF2, "pipit_ping_pong"),
		fam("pipit_ping_pong_papi", replay.FormatOTF2, "pipit_ping_pong_papi"),
		fam("fastotf2_mi300", replay.FormatOTF2, "fastotf2_mi300"),
		fam("rocprof_memcpy", replay.FormatChrome, "rocprof_memcpy"),
		fam("caliper_doc_trace", replay.FormatCaliper, "caliper_doc_trace"),
		fam("caliper_cxx_example", replay.FormatCaliper, "caliper_cxx_example"),
		fam("catapult_unclosed_slices", replay.FormatChrome, "catapult_unclosed_slices"),
	}
}
