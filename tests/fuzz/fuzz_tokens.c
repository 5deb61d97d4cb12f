/* libFuzzer: the llm.c token-shard reader, from a memory file, then every token read. */
#include <fsdp/data.h>
#include <fsdp/log.h>

#include "nn/nn_hidden.h" /* fsdp_tokens_at */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

static int fd = -1;
static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fsdp_log_set_level(FSDP_LOG_OFF);
    fd = memfd_create("fuzz_tokens", 0);
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    return fd < 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fsdp_tokens_t *t;
    uint32_t max = 0;

    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
        return 0;
    if (fsdp_tokens_open_llmc(path, SIZE_MAX, &t) != FSDP_OK)
        return 0;
    for (size_t i = 0; i < fsdp_tokens_count(t); i++)
        max = fsdp_tokens_at(t, i) > max ? fsdp_tokens_at(t, i) : max;
    if (max != fsdp_tokens_max_id(t))
        __builtin_trap();
    fsdp_tokens_close(t);
    return 0;
}
