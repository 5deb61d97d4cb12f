/* Status codes and their messages, from the one table in status.h. */
#include <fsdp/status.h>

const char *fsdp_status_string(fsdp_status_t status)
{
    switch (status) {
#define FSDP_STATUS_MSG_(name, value, msg)                                                         \
    case FSDP_##name:                                                                              \
        return msg;
        FSDP_FOREACH_STATUS(FSDP_STATUS_MSG_)
#undef FSDP_STATUS_MSG_
    }
    return "unknown status";
}

const char *fsdp_status_name(fsdp_status_t status)
{
    switch (status) {
#define FSDP_STATUS_NAME_(name, value, msg)                                                        \
    case FSDP_##name:                                                                              \
        return "FSDP_" #name;
        FSDP_FOREACH_STATUS(FSDP_STATUS_NAME_)
#undef FSDP_STATUS_NAME_
    }
    return "FSDP_UNKNOWN";
}
