/* placeholder */ typedef int fsdp_placeholder_t;
