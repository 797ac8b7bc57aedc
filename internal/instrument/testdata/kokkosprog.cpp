// kokkosprog.cpp: a small Kokkos program with known regions, kernels, deep
// copies and fences, for the Kokkos Tools connector's tests.
// Usage: kokkosprog ITERS ELEMS
//
// Inside region "outer", each iteration opens region "step" and runs in it
// parallel_for "fill", parallel_reduce "sum", parallel_scan "prefix", a
// deep copy of ELEMS doubles to a host mirror, and a fence labelled
// "step fence" (reported the way Kokkos reports its own fences). It prints
// "result SUM" and exits 0.
#include <Kokkos_Core.hpp>
#include <cstdio>
#include <cstdlib>

int main(int argc, char **argv) {
	int iters = argc > 1 ? std::atoi(argv[1]) : 10;
	int n = argc > 2 ? std::atoi(argv[2]) : 1000;
	Kokkos::initialize(argc, argv);
	{
		Kokkos::View<double *> a("a", n), b("b", n);
		auto h = Kokkos::create_mirror(b);
		double total = 0;
		Kokkos::Profiling::pushRegion("outer");
		for (int it = 0; it < iters; it++) {
			Kokkos::Profiling::pushRegion("step");
			Kokkos::parallel_for("fill", n, KOKKOS_LAMBDA(int i) { a(i) = i + it; });
			double s = 0;
			Kokkos::parallel_reduce("sum", n, KOKKOS_LAMBDA(int i, double &acc) { acc += a(i); }, s);
			Kokkos::parallel_scan("prefix", n, KOKKOS_LAMBDA(int i, double &upd, bool final) {
				upd += a(i);
				if (final)
					b(i) = upd;
			});
			Kokkos::deep_copy(h, b);
			uint64_t fence;
			Kokkos::Tools::beginFence("step fence", 0, &fence);
			Kokkos::fence();
			Kokkos::Tools::endFence(fence);
			total += s + h(n - 1);
			Kokkos::Profiling::popRegion();
		}
		Kokkos::Profiling::popRegion();
		std::printf("result %.1f\n", total);
	}
	Kokkos::finalize();
	return 0;
}
