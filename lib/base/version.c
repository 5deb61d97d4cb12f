#include <fsdp/version.h>

unsigned fsdp_version(void)
{
    return FSDP_VERSION_HEX;
}

const char *fsdp_version_string(void)
{
    return FSDP_VERSION_STRING;
}
