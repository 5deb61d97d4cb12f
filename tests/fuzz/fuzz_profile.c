/* libFuzzer: a cluster profile's JSON; one that parses is checked, written and read back. */
#include <fsdp/log.h>
#include <fsdp/sim.h>

#include "sim/sim_hidden.h" /* fsdp_sim_profile_parse and _check */

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
    char *json = malloc(size + 1), *again;
    fsdp_sim_profile_t p, q;

    if (json == NULL)
        return 0;
    memcpy(json, data, size);
    json[size] = '\0';
    if (fsdp_sim_profile_parse(json, &p) == FSDP_OK && fsdp_sim_profile_check(&p) == FSDP_OK) {
        again = fsdp_sim_profile_to_json(&p);
        if (again != NULL && fsdp_sim_profile_parse(again, &q) != FSDP_OK)
            __builtin_trap(); /* what we write, we read */
        free(again);
    }
    free(json);
    return 0;
}
