/* libFuzzer: Slurm host lists ("node[3-5,7],gpu01"), every host of the list expanded. */
#include <fsdp/gpu.h>
#include <fsdp/log.h>

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fsdp_log_set_level(FSDP_LOG_OFF);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *list = malloc(size + 1), host[256];

    if (list == NULL)
        return 0;
    memcpy(list, data, size);
    list[size] = '\0';
    /* a node's index is below the job's node count: the walk to it is linear in it */
    for (int i = 0; i < 64; i++) {
        if (fsdp_hostlist_get(list, i, host, sizeof(host)) != FSDP_OK)
            break;
        if (memchr(host, '\0', sizeof(host)) == NULL)
            __builtin_trap();
    }
    free(list);
    return 0;
}
