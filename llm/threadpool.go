package llm

/*
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

// ggml.h and llama.h are not included here (their include paths belong to
// the binding); these match their declarations at the pinned llama.cpp:
// struct ggml_threadpool_params is { bool cpumask[GGML_MAX_N_THREADS = 512];
// int n_threads; enum ggml_sched_priority prio; uint32_t poll; bool
// strict_cpu; bool paused; }. The mirror sits in a union with room to spare,
// so that ggml_threadpool_params_init can never write past it, and
// parley_threadpool_new checks the fields init wrote before using them.
struct ggml_threadpool;
struct llama_context;
struct parley_tp_params {
	bool     cpumask[512];
	int      n_threads;
	int      prio;
	uint32_t poll;
	bool     strict_cpu;
	bool     paused;
};
union parley_tp_params_buf {
	struct parley_tp_params p;
	char room[4096];
};
extern void ggml_threadpool_params_init(struct parley_tp_params *p, int n_threads);
extern struct ggml_threadpool *ggml_threadpool_new(struct parley_tp_params *p);
extern void ggml_threadpool_free(struct ggml_threadpool *tp);
extern void llama_attach_threadpool(struct llama_context *ctx, struct ggml_threadpool *tp, struct ggml_threadpool *tp_batch);
extern void llama_detach_threadpool(struct llama_context *ctx);
extern void llama_free(struct llama_context *ctx);

// parley_threadpool_new makes a pool of n_threads workers polling at poll
// (0-100). NULL when the parameters init wrote are not the mirrored layout
// (init's documented defaults: poll 50, normal priority, not strict, not
// paused) or when ggml could not start the pool.
static struct ggml_threadpool *parley_threadpool_new(int n_threads, uint32_t poll) {
	union parley_tp_params_buf b;
	memset(&b, 0xAB, sizeof b);
	ggml_threadpool_params_init(&b.p, n_threads);
	if (b.p.n_threads != n_threads || b.p.poll != 50 || b.p.prio != 0 || b.p.strict_cpu || b.p.paused) {
		return NULL;
	}
	b.p.poll = poll;
	return ggml_threadpool_new(&b.p);
}
*/
import "C"

import (
	"errors"
	"unsafe"

	"github.com/ollama/ollama/llama"
)

// DefaultPoll is ggml's default polling level, and what pays on a CPU
// (docs/notes/2026-11-25-thread-pool-and-engines.md): the workers spin briefly between graphs
// instead of sleeping, so a decode step starts without waking them.
const DefaultPoll = 50

// threadPool is a persistent ggml thread pool attached to one llama.cpp
// context. Without one, ggml makes a throwaway pool for every graph: one
// thread started and joined per worker per decoded token.
type threadPool struct {
	lc *C.struct_llama_context
	tp *C.struct_ggml_threadpool
}

// bindingContext mirrors the binding's llama.Context: { c
// *C.struct_llama_context; numThreads int }. contextPointer checks
// numThreads against the threads Open asked for before trusting c.
type bindingContext struct {
	c          unsafe.Pointer
	numThreads int
}

// contextPointer returns the llama_context behind lc, or nil when the
// binding's struct is not the mirrored one.
func contextPointer(lc *llama.Context, threads int) *C.struct_llama_context {
	var probe bindingContext
	if unsafe.Sizeof(*lc) != unsafe.Sizeof(probe) {
		return nil
	}
	bc := (*bindingContext)(unsafe.Pointer(lc))
	if bc.numThreads != threads || bc.c == nil {
		return nil
	}
	return (*C.struct_llama_context)(bc.c)
}

// freeContext frees lc's llama.cpp context (its KV cache and compute
// buffers), which the binding has no call for: without it a model that is
// unloaded and loaded again (several models) leaks its context
// each time. It reports false, freeing nothing, when lc is not the mirrored
// binding context. lc must not be used afterwards.
func freeContext(lc *llama.Context, threads int) bool {
	c := contextPointer(lc, threads)
	if c == nil {
		return false
	}
	C.llama_free(c)
	return true
}

// attachThreadPool makes a pool of threads workers polling at poll (0-100)
// and attaches it to lc, for single-token and batched steps alike.
func attachThreadPool(lc *llama.Context, threads, poll int) (*threadPool, error) {
	c := contextPointer(lc, threads)
	if c == nil {
		return nil, errors.New("the binding's context is not the one this build knows")
	}
	if poll < 0 || poll > 100 {
		return nil, errors.New("poll must be 0 to 100")
	}
	tp := C.parley_threadpool_new(C.int(threads), C.uint32_t(poll))
	if tp == nil {
		return nil, errors.New("ggml could not make the thread pool (or its parameters are not the ones this build knows)")
	}
	C.llama_attach_threadpool(c, tp, tp)
	return &threadPool{lc: c, tp: tp}, nil
}

// free detaches the pool from its context and stops its workers. The
// context must not be decoding (the loop has ended).
func (p *threadPool) free() {
	if p == nil {
		return
	}
	C.llama_detach_threadpool(p.lc)
	C.ggml_threadpool_free(p.tp)
}
