/*
 * kipimo_cyg.c: compiler instrumentation. Code built with
 * -finstrument-functions (GCC and Clang) calls __cyg_profile_func_enter and
 * __cyg_profile_func_exit around every function; this library defines them
 * (taking precedence over glibc's empty ones when preloaded or linked) and
 * records the calls by code address. Names are resolved off the hot path, by
 * the collector, when a function first appears in a frame: the dynamic
 * symbol table through dladdr, else the object file's own .symtab (static
 * functions, executables not linked with -rdynamic), then demangled with
 * __cxa_demangle when the program carries a C++ runtime.
 */
#define _GNU_SOURCE
#include "kipimo_internal.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

uint32_t kp_addr_id(uintptr_t addr);

#define NOINSTR __attribute__((no_instrument_function))

NOINSTR void __cyg_profile_func_enter(void *fn, void *site) {
	(void)site;
	if (!kp_ensure_started())
		return;
	kp_enter(kp_addr_id((uintptr_t)fn));
}

NOINSTR void __cyg_profile_func_exit(void *fn, void *site) {
	(void)site;
	if (!kp_ensure_started())
		return;
	kp_exit(kp_addr_id((uintptr_t)fn));
}

/* An object file's function symbols, sorted by address. */
typedef struct {
	uintptr_t value, size;
	const char *name;
} sym;

typedef struct {
	char path[1024];
	void *map;
	size_t maplen;
	sym *syms;
	size_t n;
	int is_exec; /* ET_EXEC: symbol values are absolute */
} object;

#define MAX_OBJECTS 64
static object objects[MAX_OBJECTS];
static int nobjects;
static pthread_mutex_t objects_mu = PTHREAD_MUTEX_INITIALIZER;

static int cmp_sym(const void *a, const void *b) {
	const sym *x = a, *y = b;
	return x->value < y->value ? -1 : x->value > y->value;
}

/* load_symbols reads the function symbols of the ELF file at path, from
 * .symtab when present, else .dynsym. */
static object *load_object(const char *path) {
	for (int i = 0; i < nobjects; i++)
		if (strcmp(objects[i].path, path) == 0)
			return &objects[i];
	if (nobjects == MAX_OBJECTS)
		return NULL;
	object *o = &objects[nobjects++];
	snprintf(o->path, sizeof o->path, "%s", path);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return o;
	struct stat st;
	if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(Elf64_Ehdr)) {
		close(fd);
		return o;
	}
	void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (map == MAP_FAILED)
		return o;
	o->map = map;
	o->maplen = (size_t)st.st_size;
	const unsigned char *b = map;
	const Elf64_Ehdr *eh = map;
	if (memcmp(b, ELFMAG, SELFMAG) != 0 || b[EI_CLASS] != ELFCLASS64 || eh->e_shoff == 0 ||
	    eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shoff + (size_t)eh->e_shnum * sizeof(Elf64_Shdr) > o->maplen)
		return o;
	o->is_exec = eh->e_type == ET_EXEC;
	const Elf64_Shdr *sh = (const Elf64_Shdr *)(b + eh->e_shoff);
	const Elf64_Shdr *symtab = NULL;
	for (int pass = 0; pass < 2 && !symtab; pass++) {
		for (int i = 0; i < eh->e_shnum; i++) {
			if (sh[i].sh_type == (pass == 0 ? SHT_SYMTAB : SHT_DYNSYM)) {
				symtab = &sh[i];
				break;
			}
		}
	}
	if (!symtab || symtab->sh_link >= eh->e_shnum || symtab->sh_entsize != sizeof(Elf64_Sym))
		return o;
	const Elf64_Shdr *strs = &sh[symtab->sh_link];
	if (symtab->sh_offset + symtab->sh_size > o->maplen || strs->sh_offset + strs->sh_size > o->maplen)
		return o;
	const Elf64_Sym *syms = (const Elf64_Sym *)(b + symtab->sh_offset);
	size_t n = symtab->sh_size / sizeof(Elf64_Sym);
	o->syms = calloc(n ? n : 1, sizeof *o->syms);
	if (!o->syms)
		return o;
	const char *strbase = (const char *)(b + strs->sh_offset);
	for (size_t i = 0; i < n; i++) {
		if (ELF64_ST_TYPE(syms[i].st_info) != STT_FUNC || syms[i].st_value == 0 || syms[i].st_name >= strs->sh_size)
			continue;
		const char *nm = strbase + syms[i].st_name;
		if (!memchr(nm, 0, strs->sh_size - syms[i].st_name))
			continue;
		o->syms[o->n++] = (sym){syms[i].st_value, syms[i].st_size, nm};
	}
	qsort(o->syms, o->n, sizeof *o->syms, cmp_sym);
	return o;
}

static const char *lookup(object *o, uintptr_t v) {
	size_t lo = 0, hi = o->n;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (o->syms[mid].value <= v)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return NULL;
	sym *s = &o->syms[lo - 1];
	if (s->size && v >= s->value + s->size)
		return NULL;
	return s->name;
}

typedef char *(*demangle_fn)(const char *, char *, size_t *, int *);

static void demangle(const char *in, char *out, size_t n) {
	static demangle_fn fn;
	static int looked;
	if (!looked) {
		fn = (demangle_fn)dlsym(RTLD_DEFAULT, "__cxa_demangle");
		looked = 1;
	}
	if (fn && in[0] == '_' && in[1] == 'Z') {
		int status = 0;
		char *d = fn(in, NULL, NULL, &status);
		if (d && status == 0) {
			snprintf(out, n, "%s", d);
			free(d);
			return;
		}
		free(d);
	}
	snprintf(out, n, "%s", in);
}

static void resolve(uintptr_t addr, char *out, size_t n);

/* kp_resolve_name writes the name of the function at addr to out: its
 * demangled symbol, or "[object+0xoffset]" when no symbol covers it. Safe
 * from any thread; called once per function. */
void kp_resolve_name(uintptr_t addr, char *out, size_t n) {
	pthread_mutex_lock(&objects_mu);
	resolve(addr, out, n);
	pthread_mutex_unlock(&objects_mu);
}

static void resolve(uintptr_t addr, char *out, size_t n) {
	Dl_info info;
	memset(&info, 0, sizeof info);
	if (!dladdr((void *)addr, &info) || !info.dli_fname) {
		snprintf(out, n, "[0x%lx]", (unsigned long)addr);
		return;
	}
	if (info.dli_sname && info.dli_saddr == (void *)addr) {
		demangle(info.dli_sname, out, n);
		return;
	}
	const char *path = info.dli_fname;
	char exe[1024];
	if (!path[0] || strchr(path, '/') == NULL) {
		/* the main program: dladdr gives argv[0], which may not be a path */
		ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
		if (l > 0) {
			exe[l] = 0;
			path = exe;
		}
	}
	object *o = load_object(path);
	uintptr_t base = (uintptr_t)info.dli_fbase;
	const char *nm = o ? lookup(o, o->is_exec ? addr : addr - base) : NULL;
	if (nm) {
		demangle(nm, out, n);
		return;
	}
	const char *slash = strrchr(path, '/');
	snprintf(out, n, "[%s+0x%lx]", slash ? slash + 1 : path, (unsigned long)(addr - base));
}
