package llm

/*
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

// parley_is_mapped reports whether glibc's malloc gave p a mapping of its
// own: the IS_MMAPPED bit (0x2) of its chunk's size field, the word before p.
static int parley_is_mapped(void *p) { return (((size_t *)p)[-1] & 2) != 0; }
*/
import "C"

import (
	"sync"
	"unsafe"
)

// mallocForWeights fixes glibc's malloc thresholds at minWeightMapping, once
// per process, before the first load onto huge pages.
//
// By default glibc raises its mmap threshold (up to 32 MiB) each time a
// mapped block is freed, and its trim threshold to twice that: a freed
// model's buffers can then leave up to 64 MiB of free memory at the top of a
// malloc arena, and the next model's weights are carved from it, inside a
// mapping that existed before the load, where the bracket of
// loadOnHugePages cannot tell them from the heap. With both thresholds
// fixed, a block of minWeightMapping or more is always a mapping of its own
// (returned to the kernel when freed), and no arena keeps that much free at
// its top, so a model's weights always arrive in new mappings. Blocks
// smaller than that are served as before.
var mallocForWeights = sync.OnceFunc(func() {
	C.mallopt(C.M_MMAP_THRESHOLD, C.int(minWeightMapping))
	C.mallopt(C.M_TRIM_THRESHOLD, C.int(minWeightMapping))
})

// cBlock allocates size bytes with C's malloc and writes to every page
// (tests use it to see where glibc puts a block).
func cBlock(size int) unsafe.Pointer {
	p := C.malloc(C.size_t(size))
	C.memset(p, 1, C.size_t(size))
	return p
}

// freeBlock frees what cBlock allocated.
func freeBlock(p unsafe.Pointer) { C.free(p) }

// isMapped reports whether glibc made p, a block cBlock allocated, a
// mapping of its own.
func isMapped(p unsafe.Pointer) bool { return C.parley_is_mapped(p) != 0 }
