/* The library version at run time (include/fsdp/version.h has the compile-time macros). */
#include <fsdp/version.h>

unsigned fsdp_version(void)
{
    return FSDP_VERSION_HEX;
}

const char *fsdp_version_string(void)
{
    return FSDP_VERSION_STRING;
}
