/* The base, hidden: names the tests print.
 *
 * libfsdp.so exports only the user API of include/fsdp/ (DESIGN.md, "Layers"); these functions are
 * declared here instead, for the rest of the library and for the tests and benchmarks that link
 * the library's parts statically (FSDP_INTERNAL_LIBS in common.am). */
#ifndef FSDP_BASE_HIDDEN_H
#define FSDP_BASE_HIDDEN_H

#include <fsdp/types.h>

/* ---- from <fsdp/types.h> ---- */

const char *fsdp_reduce_op_name(fsdp_reduce_op_t op);

#endif
