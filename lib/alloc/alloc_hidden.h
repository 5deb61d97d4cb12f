/* The caching allocator, hidden: its life cycle, owned by the core, and its checks and counters.
 *
 * libfsdp.so exports only the user API of include/fsdp/ (DESIGN.md, "Layers"); these functions are
 * declared here instead, for the rest of the library and for the tests and benchmarks that link
 * the library's parts statically (FSDP_INTERNAL_LIBS in common.am). */
#ifndef FSDP_ALLOC_HIDDEN_H
#define FSDP_ALLOC_HIDDEN_H

#include <fsdp/memory.h>

/* ---- from <fsdp/memory.h> ---- */

/* capacity: bytes the device may hold (0 = unlimited). A segment that would take the reserved
 * bytes past it fails as cudaMalloc would, without calling the backend. */
fsdp_status_t fsdp_mem_create(fsdp_dev_t *dev, size_t capacity, fsdp_mem_t **mem_p);

/* Returns every segment to the backend, live blocks included. Accepts NULL. */
void fsdp_mem_destroy(fsdp_mem_t *mem);

/* Who is allocating (a unit name and a phase such as "pre_forward"; the strings must stay
 * valid), named by the out-of-memory report. The runtime sets it in its hooks. */
void fsdp_mem_set_context(fsdp_mem_t *mem, const char *unit, const char *phase);

/* Just the current allocated and reserved bytes (cheap: for every trace event). */
void fsdp_mem_current(const fsdp_mem_t *mem, size_t *allocated_p, size_t *reserved_p);

/* The live statistics of all blocks (pool FSDP_MEM_POOL_ALL), updated in place by every
 * allocation and free, for readers that must not call back into the allocator (the trace
 * writer stamps each event with allocated_bytes.current and reserved_bytes.current). Valid
 * until fsdp_mem_destroy; read on the thread that allocates. */
const fsdp_mem_pool_stats_t *fsdp_mem_counters(const fsdp_mem_t *mem);

/* Waits for the events of record_stream'd blocks, then returns every segment that is one free
 * block to the backend (torch.cuda.empty_cache). */
fsdp_status_t fsdp_mem_empty_cache(fsdp_mem_t *mem);

/* Request size rounded as the allocator rounds it; 0 when not representable. */
size_t fsdp_mem_round_size(size_t bytes);

/* Size of the live block at ptr (at least the rounded request), or 0 when ptr is not one. */
size_t fsdp_mem_block_size(const fsdp_mem_t *mem, const void *ptr);

/* Calls func for every block, segment by segment in the order they were allocated, blocks by
 * address. */
void fsdp_mem_snapshot(const fsdp_mem_t *mem, fsdp_mem_visit_func_t func, void *arg);

/* Checks the allocator's internal invariants (blocks tile their segments, free neighbours are
 * merged, indexes and statistics agree with the blocks); FSDP_ERR_INTERNAL, logged, if not.
 * Costs O(blocks): for tests and debugging. */
fsdp_status_t fsdp_mem_check(const fsdp_mem_t *mem);

#endif
