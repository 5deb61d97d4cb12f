/* The default corpus of fsdp-train's GPT models (and of the tests and benchmarks that train on
 * it): the project's own sources. */
#ifndef FSDP_TOOLS_CORPUS_H
#define FSDP_TOOLS_CORPUS_H

#include <fsdp/data.h>

/* README.md, DESIGN.md and the C files of lib/'s rooms (lib/<room>/<file>.c) of the source tree,
 * concatenated in that (sorted) order, as bytes; its source reads "the libfsdp sources in
 * <tree>". The tree is looked for at the build's source directory, then above the running
 * program (argv0, or /proc/self/exe when NULL). None found is FSDP_ERR_IO, logged with where it
 * looked. */
fsdp_status_t corpus_open_default(const char *argv0, fsdp_tokens_t **tokens_p);

#endif
