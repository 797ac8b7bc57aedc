/*
 * oclprog.c: a small OpenCL program with known commands, for the OpenCL
 * interposer's tests. Usage: oclprog ITERS ELEMS
 *
 * Queue A is created without profiling, queue B with it. Each iteration:
 *   A: write a, write b (no event), vadd c = a + b (no event), read c (blocking)
 *   B: scale a2 *= 2 (event), copy a2 -> b2 (event), fill b2 (event), then
 *      clWaitForEvents; the program prints each of those three commands'
 *      own profiling reading: "prof NAME START END".
 * Then once: map c on A, unmap it, clFinish on both, and a checksum of the
 * results: "result SUM". Exit status 0 when every result checks, 3 when one
 * does not, 2 when OpenCL fails.
 */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *src =
    "__kernel void vadd(__global const float *a, __global const float *b, __global float *c) {\n"
    "  size_t i = get_global_id(0); c[i] = a[i] + b[i]; }\n"
    "__kernel void scale(__global float *a) { size_t i = get_global_id(0); a[i] = a[i] * 2.0f; }\n";

#define CHECK(x)                                                               \
	do {                                                                       \
		cl_int e_ = (x);                                                       \
		if (e_ != CL_SUCCESS) {                                                \
			fprintf(stderr, "%s:%d: %s: %d\n", __FILE__, __LINE__, #x, e_);    \
			exit(2);                                                           \
		}                                                                      \
	} while (0)

static void prof(const char *name, cl_event ev) {
	cl_ulong s = 0, e = 0;
	CHECK(clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof s, &s, NULL));
	CHECK(clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof e, &e, NULL));
	printf("prof %s %llu %llu\n", name, (unsigned long long)s, (unsigned long long)e);
}

int main(int argc, char **argv) {
	int iters = argc > 1 ? atoi(argv[1]) : 10;
	size_t n = argc > 2 ? (size_t)atol(argv[2]) : 4096;
	size_t bytes = n * sizeof(float);
	cl_platform_id plat;
	cl_device_id dev;
	cl_int err;
	CHECK(clGetPlatformIDs(1, &plat, NULL));
	CHECK(clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
	cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
	CHECK(err);
	cl_command_queue qa = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
	CHECK(err);
	cl_queue_properties props[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
	cl_command_queue qb = clCreateCommandQueueWithProperties(ctx, dev, props, &err);
	CHECK(err);
	cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
	CHECK(err);
	CHECK(clBuildProgram(prog, 1, &dev, "", NULL, NULL));
	cl_kernel vadd = clCreateKernel(prog, "vadd", &err);
	CHECK(err);
	cl_kernel scale = clCreateKernel(prog, "scale", &err);
	CHECK(err);
	cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
	cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
	cl_mem c = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
	cl_mem a2 = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
	cl_mem b2 = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
	CHECK(err);
	float *ha = malloc(bytes), *hb = malloc(bytes), *hc = malloc(bytes);
	for (size_t i = 0; i < n; i++) {
		ha[i] = (float)i;
		hb[i] = (float)(2 * i);
	}
	CHECK(clEnqueueWriteBuffer(qb, a2, CL_TRUE, 0, bytes, ha, 0, NULL, NULL));
	CHECK(clSetKernelArg(vadd, 0, sizeof a, &a));
	CHECK(clSetKernelArg(vadd, 1, sizeof b, &b));
	CHECK(clSetKernelArg(vadd, 2, sizeof c, &c));
	CHECK(clSetKernelArg(scale, 0, sizeof a2, &a2));
	int bad = 0;
	double sum = 0;
	float zero = 0;
	for (int it = 0; it < iters; it++) {
		CHECK(clEnqueueWriteBuffer(qa, a, CL_FALSE, 0, bytes, ha, 0, NULL, NULL));
		CHECK(clEnqueueWriteBuffer(qa, b, CL_FALSE, 0, bytes, hb, 0, NULL, NULL));
		CHECK(clEnqueueNDRangeKernel(qa, vadd, 1, NULL, &n, NULL, 0, NULL, NULL));
		CHECK(clEnqueueReadBuffer(qa, c, CL_TRUE, 0, bytes, hc, 0, NULL, NULL));
		for (size_t i = 0; i < n; i++)
			bad |= hc[i] != ha[i] + hb[i];
		sum += hc[n - 1];
		cl_event ev[3];
		CHECK(clEnqueueNDRangeKernel(qb, scale, 1, NULL, &n, NULL, 0, NULL, &ev[0]));
		CHECK(clEnqueueCopyBuffer(qb, a2, b2, 0, 0, bytes, 0, NULL, &ev[1]));
		CHECK(clEnqueueFillBuffer(qb, b2, &zero, sizeof zero, 0, bytes / 2, 0, NULL, &ev[2]));
		CHECK(clWaitForEvents(3, ev));
		prof("scale", ev[0]);
		prof("OpenCL Copy Buffer", ev[1]);
		prof("OpenCL Fill Buffer", ev[2]);
		for (int k = 0; k < 3; k++)
			CHECK(clReleaseEvent(ev[k]));
	}
	float *m = clEnqueueMapBuffer(qa, c, CL_TRUE, CL_MAP_READ, 0, bytes, 0, NULL, NULL, &err);
	CHECK(err);
	sum += m[1];
	CHECK(clEnqueueUnmapMemObject(qa, c, m, 0, NULL, NULL));
	CHECK(clEnqueueReadBuffer(qb, b2, CL_TRUE, 0, bytes, hc, 0, NULL, NULL));
	for (size_t i = 0; i < n; i++) {
		float want = ha[i];
		for (int k = 0; k < iters; k++)
			want *= 2.0f;
		bad |= hc[i] != (i < n / 2 ? 0.0f : want);
	}
	sum += hc[n - 1];
	CHECK(clFinish(qa));
	CHECK(clFinish(qb));
	printf("result %.1f\n", sum);
	clReleaseKernel(vadd);
	clReleaseKernel(scale);
	clReleaseProgram(prog);
	clReleaseCommandQueue(qa);
	clReleaseCommandQueue(qb);
	clReleaseContext(ctx);
	return bad ? 3 : 0;
}
