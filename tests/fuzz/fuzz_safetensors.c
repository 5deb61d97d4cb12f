/* libFuzzer: the safetensors reader over a buffer, then every tensor looked up and scanned. */
#include <fsdp/log.h>
#include <fsdp/safetensors.h>

#include "io/io_hidden.h" /* fsdp_st_open_buffer, fsdp_st_metadata */

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fsdp_log_set_level(FSDP_LOG_OFF);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fsdp_st_file_t *f;

    if (fsdp_st_open_buffer(data, size, "fuzz", &f) != FSDP_OK)
        return 0;
    for (int i = 0; i < fsdp_st_num_tensors(f); i++) {
        const fsdp_st_tensor_t *t = fsdp_st_tensor_at(f, i);

        if (fsdp_st_find(f, t->name) == NULL)
            __builtin_trap(); /* every listed tensor is found by name */
        (void)fsdp_st_check_finite(t, "fuzz");
    }
    (void)fsdp_st_metadata(f, "format");
    fsdp_st_close(f);
    return 0;
}
