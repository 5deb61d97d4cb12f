/* libFuzzer: the rendezvous messages. The first byte picks a side: rank 0 reading a request
 * (the bytes arrive on a socket, as from a peer), or a joining rank judging an answer. */
#include "../../gpu/rendezvous.c"

#include <sys/socket.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fsdp_log_set_level(FSDP_LOG_OFF);
    return 0;
}

static void server_side(const uint8_t *data, size_t size)
{
    fsdp_launch_info_t info = {.rank = 0, .world_size = 4, .master_port = 1};
    rdv_pending_t pending[RDV_PENDING_MAX];
    int joined[4] = {-1, -1, -1, -1}, sv[2];
    rdv_server_t srv = {.info = &info,
                        .token = (const unsigned char *)"tok",
                        .token_len = 3,
                        .blob_size = 128,
                        .pending = pending,
                        .joined_fd = joined};

    if (size > 4096 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0)
        return;
    memset(pending, 0, sizeof(pending));
    for (int i = 0; i < RDV_PENDING_MAX; i++)
        pending[i].fd = -1;
    pending[0].fd = sv[0];
    snprintf(pending[0].peer, sizeof(pending[0].peer), "fuzz");
    if (send(sv[1], data, size, MSG_NOSIGNAL) == (ssize_t)size) {
        shutdown(sv[1], SHUT_WR);
        for (int k = 0; k < 4 && pending[0].fd >= 0; k++)
            server_read(&srv, &pending[0]);
    }
    /* sv[0] is still pending, or joined, or was closed by a refusal */
    close_fd(&pending[0].fd);
    for (int r = 0; r < 4; r++)
        close_fd(&joined[r]);
    close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fsdp_launch_info_t info = {.rank = 1, .world_size = 4, .master_addr = "fuzz", .master_port = 1};

    if (size < 1)
        return 0;
    if (data[0] & 1)
        server_side(data + 1, size - 1);
    else if (size >= 1 + RDV_ANS_BYTES)
        (void)client_check_answer(&info, data + 1, 128);
    return 0;
}
