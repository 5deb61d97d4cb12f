/* The rendezvous: rank 0 hands a small blob (NCCL's unique id) to every other rank over TCP at
 * the master address, once all have joined, so that a missing rank times everyone out instead
 * of leaving NCCL's own bootstrap to hang. Built with or without CUDA.
 *
 * Wire format (big-endian), one request and one answer per connection:
 *   request: magic "FSDR", u16 version, u16 0, u32 rank, u32 world size, u32 blob size,
 *            u32 token length (<= FSDP_RENDEZVOUS_TOKEN_MAX), token bytes;
 *   answer:  magic "FSDR", u32 code, u32 detail, u32 blob length, blob (only when code is OK).
 * Rank 0 reads requests with poll() from one thread, holds the joined connections open and
 * answers them all when the last rank has joined, or with RDV_TIMEOUT when time runs out.
 *
 * A peer without the token must not be able to keep a rank out by holding connections open:
 * the table of connections still sending their request is bounded, and when it is full the
 * oldest connection of the address holding the most slots makes room for the new one. A rank
 * sends its whole request as soon as it connects, and is read at once on accept, so it is
 * judged before a flood can push it out; if it is pushed out, it connects again. */
#include "config.h"

#include <fsdp/gpu.h>
#include <fsdp/log.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RDV_MAGIC 0x46534452u /* "FSDR" */
#define RDV_VERSION 1u
#define RDV_REQ_BYTES 24
#define RDV_ANS_BYTES 16
#define RDV_LISTEN_MAX 4
/* Connections whose request is still being read; a new one evicts an old one. */
#define RDV_PENDING_MAX 64
/* Connections accepted per turn of the loop, so that those accepted are read before the next
 * ones can evict them. */
#define RDV_ACCEPT_BATCH (RDV_PENDING_MAX / 4)
/* Seconds a connection may take to send its whole request (a rank sends it in one write). */
#define RDV_REQUEST_S 1.0
/* Dropped connections, and refused requests, named in the log before the rest of each are only
 * counted (a peer with a wrong token may send thousands a second). */
#define RDV_WARN_MAX 8
/* Seconds between connection attempts while rank 0 is not up. */
#define RDV_RETRY_S 0.05

/* Answer codes. */
enum {
    RDV_OK = 0,
    RDV_BAD_TOKEN = 1,
    RDV_RANK_JOINED = 2,
    RDV_BAD_WORLD = 3,
    RDV_BAD_RANK = 4,
    RDV_BAD_BLOB_SIZE = 5,
    RDV_BAD_VERSION = 6,
    RDV_TIMEOUT = 7
};

typedef struct {
    int fd; /* -1: free slot */
    size_t got;
    uint64_t seq; /* order of acceptance: the lowest is the oldest */
    double expires;
    uint32_t token_len;
    unsigned char req[RDV_REQ_BYTES];
    unsigned char token[FSDP_RENDEZVOUS_TOKEN_MAX];
    char peer[INET6_ADDRSTRLEN + 8];
    char host[INET6_ADDRSTRLEN]; /* the peer without its port */
} rdv_pending_t;

typedef struct {
    const fsdp_launch_info_t *info;
    const unsigned char *token;
    size_t token_len;
    uint32_t blob_size;
    double deadline;
    int listen_fd[RDV_LISTEN_MAX];
    int nlisten;
    rdv_pending_t *pending; /* RDV_PENDING_MAX slots */
    int *joined_fd;         /* per rank; -1 when not joined */
    int njoined;            /* ranks other than 0 joined */
    uint64_t naccepted;
    uint64_t ndropped; /* connections dropped before a whole request */
    uint64_t nrefused; /* whole requests refused */
} rdv_server_t;

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Milliseconds from now until t, for poll (at least 0, at most a minute: the loops recheck). */
static int ms_until(double t)
{
    double ms = (t - now_s()) * 1e3 + 0.999; /* rounded up: never wake just before t */

    return ms <= 0 ? 0 : ms > 60000 ? 60000 : (int)ms;
}

static void put32(unsigned char *p, uint32_t v)
{
    v = htonl(v);
    memcpy(p, &v, 4);
}

static uint32_t get32(const unsigned char *p)
{
    uint32_t v;

    memcpy(&v, p, 4);
    return ntohl(v);
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void peer_name(int fd, rdv_pending_t *c)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    char port[8];

    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0 ||
        getnameinfo((struct sockaddr *)&ss, len, c->host, sizeof(c->host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(c->host, sizeof(c->host), "?");
        snprintf(c->peer, sizeof(c->peer), "an unknown peer");
        return;
    }
    snprintf(c->peer, sizeof(c->peer), "%s:%s", c->host, port);
}

/* Writes all of buf on a non-blocking socket before deadline. 0, or -1 with errno. */
static int send_all(int fd, const void *buf, size_t len, double deadline)
{
    const unsigned char *p = buf;

    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        if (now_s() >= deadline) {
            errno = ETIMEDOUT;
            return -1;
        }
        if (poll(&pfd, 1, ms_until(deadline)) < 0 && errno != EINTR)
            return -1;
    }
    return 0;
}

/* Reads exactly len bytes before deadline. Returns len, the bytes read before the peer closed
 * (less than len), or -1 with errno (ETIMEDOUT when time ran out). */
static ssize_t recv_all(int fd, void *buf, size_t len, double deadline)
{
    unsigned char *p = buf;
    size_t got = 0;

    while (got < len) {
        ssize_t n = recv(fd, p + got, len - got, 0);

        if (n > 0) {
            got += (size_t)n;
            continue;
        }
        if (n == 0)
            return (ssize_t)got;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (now_s() >= deadline) {
            errno = ETIMEDOUT;
            return -1;
        }
        if (poll(&pfd, 1, ms_until(deadline)) < 0 && errno != EINTR)
            return -1;
    }
    return (ssize_t)got;
}

static int is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
    return 0;
}

/* Compares the token received with the job's in time independent of where they differ. */
static int token_ok(const rdv_server_t *srv, const unsigned char *got, size_t got_len)
{
    unsigned char diff = 0;

    if (srv->token_len == 0)
        return 1;
    for (size_t i = 0; i < srv->token_len; i++)
        diff |= (unsigned char)(srv->token[i] ^ (i < got_len ? got[i] : 0));
    return diff == 0 && got_len == srv->token_len;
}

/* ---- rank 0 ---- */

static int warned_no_token; /* once per process */

static fsdp_status_t server_listen(rdv_server_t *srv)
{
    const fsdp_launch_info_t *info = srv->info;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL, *ai;
    const char *host = info->master_addr;
    char port[8];
    int rc, loopback = 1, last_errno = 0;

    snprintf(port, sizeof(port), "%d", info->master_port);
    rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) {
        fsdp_error("rendezvous: cannot resolve master address %s: %s", host, gai_strerror(rc));
        return FSDP_ERR_INVALID_PARAM;
    }
    for (ai = res; ai != NULL; ai = ai->ai_next)
        loopback &= is_loopback(ai->ai_addr);
    if (!loopback && srv->token_len == 0 &&
        !__atomic_exchange_n(&warned_no_token, 1, __ATOMIC_RELAXED))
        fsdp_warn("rendezvous: no job token is set and %s is not a loopback address: any host "
                  "that reaches port %d can join as a rank (set FSDP_JOB_TOKEN on every rank)",
                  host, info->master_port);
    if (!loopback) {
        /* The master address is how the other nodes see this one, which may resolve here to
         * another interface (or a 127.0.1.1 alias): listen on them all, as torchrun does. */
        freeaddrinfo(res);
        res = NULL;
        host = NULL;
        rc = getaddrinfo(NULL, port, &hints, &res);
        if (rc != 0) {
            fsdp_error("rendezvous: cannot resolve the wildcard address: %s", gai_strerror(rc));
            return FSDP_ERR_IO;
        }
    }
    for (ai = res; ai != NULL && srv->nlisten < RDV_LISTEN_MAX; ai = ai->ai_next) {
        int one = 1;
        int fd =
            socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);

        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        /* IPv6 sockets stay IPv6-only, so that the IPv4 wildcard can be bound beside. */
        if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
            (ai->ai_family == AF_INET6 &&
             setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) != 0) ||
            bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
            last_errno = errno;
            close(fd);
            continue;
        }
        srv->listen_fd[srv->nlisten++] = fd;
    }
    freeaddrinfo(res);
    if (srv->nlisten == 0) {
        fsdp_error("rendezvous: rank 0 cannot listen on %s port %d: %s",
                   host != NULL ? host : "every interface", info->master_port,
                   strerror(last_errno));
        return FSDP_ERR_IO;
    }
    return FSDP_OK;
}

static void answer(int fd, uint32_t code, uint32_t detail, const void *blob, uint32_t blob_len,
                   double deadline)
{
    unsigned char msg[RDV_ANS_BYTES + FSDP_RENDEZVOUS_BLOB_MAX];

    put32(msg, RDV_MAGIC);
    put32(msg + 4, code);
    put32(msg + 8, detail);
    put32(msg + 12, blob_len);
    if (blob_len > 0)
        memcpy(msg + RDV_ANS_BYTES, blob, blob_len);
    (void)send_all(fd, msg, RDV_ANS_BYTES + blob_len, deadline);
}

/* Logs a dropped connection or a refused request, *count counting those of its kind (what):
 * the first RDV_WARN_MAX, the last of them saying that the rest are counted; warn_summary gives
 * the count. A flood is named a few times, not each. */
static void warn_limited(uint64_t *count, const char *what, const char *msg)
{
    uint64_t n = ++*count;

    if (n < RDV_WARN_MAX)
        fsdp_warn("rendezvous: %s", msg);
    else if (n == RDV_WARN_MAX)
        fsdp_warn("rendezvous: %s (further %s are counted, not logged)", msg, what);
}

static void warn_summary(const rdv_server_t *srv)
{
    if (srv->ndropped > RDV_WARN_MAX || srv->nrefused > RDV_WARN_MAX)
        fsdp_warn("rendezvous: rank 0 dropped %llu connections and refused %llu requests in all "
                  "(the first %d of each logged)",
                  (unsigned long long)srv->ndropped, (unsigned long long)srv->nrefused,
                  RDV_WARN_MAX);
}

/* Closes a connection that sent no whole request; why NULL: one that closed having sent
 * nothing, which is not logged. */
static void drop_pending(rdv_server_t *srv, rdv_pending_t *c, const char *why)
{
    char msg[256];

    if (why != NULL) {
        snprintf(msg, sizeof(msg), "dropped the connection from %s: %s", c->peer, why);
        warn_limited(&srv->ndropped, "drops", msg);
    }
    close_fd(&c->fd);
}

static void refuse(rdv_server_t *srv, rdv_pending_t *c, uint32_t rank, uint32_t code,
                   uint32_t detail, const char *why)
{
    char msg[256];

    snprintf(msg, sizeof(msg), "refused rank %u from %s: %s", rank, c->peer, why);
    warn_limited(&srv->nrefused, "refusals", msg);
    /* Refusals are best effort, and short: a misbehaving peer must not hold rank 0. */
    answer(c->fd, code, detail, NULL, 0, now_s() + 0.1);
    close_fd(&c->fd);
}

/* A whole request has arrived: the rank joins, or is refused. */
static void server_judge(rdv_server_t *srv, rdv_pending_t *c)
{
    uint32_t rank = get32(c->req + 8), world = get32(c->req + 12);
    uint32_t blob_size = get32(c->req + 16);
    int world_size = srv->info->world_size;
    char why[96];

    if (!token_ok(srv, c->token, c->token_len)) {
        refuse(srv, c, rank, RDV_BAD_TOKEN, 0, "job token rejected");
    } else if (world != (uint32_t)world_size) {
        snprintf(why, sizeof(why), "world size %u does not match the server's %d", world,
                 world_size);
        refuse(srv, c, rank, RDV_BAD_WORLD, (uint32_t)world_size, why);
    } else if (rank == 0 || rank >= (uint32_t)world_size) {
        snprintf(why, sizeof(why), "rank %u is out of range [1, %d)", rank, world_size);
        refuse(srv, c, rank, RDV_BAD_RANK, (uint32_t)world_size, why);
    } else if (blob_size != srv->blob_size) {
        snprintf(why, sizeof(why), "blob size %u does not match the server's %u", blob_size,
                 srv->blob_size);
        refuse(srv, c, rank, RDV_BAD_BLOB_SIZE, srv->blob_size, why);
    } else if (srv->joined_fd[rank] >= 0) {
        snprintf(why, sizeof(why), "rank %u already joined", rank);
        refuse(srv, c, rank, RDV_RANK_JOINED, 0, why);
    } else {
        fsdp_debug("rendezvous: rank %u joined from %s", rank, c->peer);
        srv->joined_fd[rank] = c->fd;
        srv->njoined++;
        c->fd = -1;
    }
}

/* Reads what a pending connection sent. */
static void server_read(rdv_server_t *srv, rdv_pending_t *c)
{
    for (;;) {
        size_t want =
            c->got < RDV_REQ_BYTES ? RDV_REQ_BYTES - c->got : RDV_REQ_BYTES + c->token_len - c->got;
        unsigned char *dst =
            c->got < RDV_REQ_BYTES ? c->req + c->got : c->token + (c->got - RDV_REQ_BYTES);
        ssize_t n;

        if (want == 0) {
            server_judge(srv, c);
            return;
        }
        n = recv(c->fd, dst, want, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            drop_pending(srv, c, c->got > 0 ? "closed in the middle of its request" : NULL);
            return;
        }
        c->got += (size_t)n;
        if (c->got == RDV_REQ_BYTES) {
            uint32_t version = get32(c->req + 4) >> 16;

            if (get32(c->req) != RDV_MAGIC || (get32(c->req + 4) & 0xffffu) != 0) {
                drop_pending(srv, c, "not a rendezvous request (bad magic)");
                return;
            }
            if (version != RDV_VERSION) {
                char why[64];

                snprintf(why, sizeof(why), "protocol version %u, not %u", version, RDV_VERSION);
                refuse(srv, c, get32(c->req + 8), RDV_BAD_VERSION, RDV_VERSION, why);
                return;
            }
            c->token_len = get32(c->req + 20);
            if (c->token_len > FSDP_RENDEZVOUS_TOKEN_MAX) {
                drop_pending(srv, c, "oversized token");
                return;
            }
        }
    }
}

/* The slot a new connection takes from a full table: the oldest connection of the address
 * that holds the most slots, so that one flooding address evicts itself first. */
static rdv_pending_t *pending_victim(rdv_server_t *srv)
{
    rdv_pending_t *victim = NULL;
    int victim_count = 0;

    for (int i = 0; i < RDV_PENDING_MAX; i++) {
        rdv_pending_t *c = &srv->pending[i];
        int count = 0;

        for (int j = 0; j < RDV_PENDING_MAX; j++)
            count += strcmp(srv->pending[j].host, c->host) == 0;
        if (victim == NULL || count > victim_count ||
            (count == victim_count && c->seq < victim->seq)) {
            victim = c;
            victim_count = count;
        }
    }
    return victim;
}

static void server_accept(rdv_server_t *srv, int lfd)
{
    for (int k = 0; k < RDV_ACCEPT_BATCH; k++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        rdv_pending_t *c = NULL;

        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE)
                fsdp_warn("rendezvous: rank 0 is out of file descriptors with %d ranks "
                          "joined: raise the limit (ulimit -n)",
                          srv->njoined);
            return; /* EAGAIN, or an aborted connection: wait for the next */
        }
        for (int i = 0; i < RDV_PENDING_MAX && c == NULL; i++)
            c = srv->pending[i].fd < 0 ? &srv->pending[i] : NULL;
        if (c == NULL) {
            c = pending_victim(srv);
            drop_pending(srv, c, "no whole request yet, and the table of connections is full");
        }
        c->fd = fd;
        c->got = 0;
        c->token_len = 0;
        c->seq = srv->naccepted++;
        c->expires = now_s() + RDV_REQUEST_S;
        peer_name(fd, c);
        server_read(srv, c); /* a rank's request is usually here already */
    }
}

/* A joined rank that sends anything more, or closes, leaves (and may join again). */
static void server_check_joined(rdv_server_t *srv, int rank)
{
    unsigned char byte;
    ssize_t n = recv(srv->joined_fd[rank], &byte, 1, 0);

    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    fsdp_warn("rendezvous: rank %d %s before every rank joined", rank,
              n > 0 ? "sent more than its request" : "left");
    close_fd(&srv->joined_fd[rank]);
    srv->njoined--;
}

/* "2, 5-7" for the ranks (other than 0) not joined; truncated with "..." when long. */
static void missing_ranks(const rdv_server_t *srv, char *buf, size_t size)
{
    int world = srv->info->world_size;
    size_t len = 0;

    buf[0] = '\0';
    for (int r = 1; r < world; r++) {
        int end = r;

        if (srv->joined_fd[r] >= 0)
            continue;
        while (end + 1 < world && srv->joined_fd[end + 1] < 0)
            end++;
        if (len + 32 >= size) {
            snprintf(buf + len, size - len, "...");
            return;
        }
        len += (size_t)snprintf(buf + len, size - len, end > r ? "%s%d-%d" : "%s%d",
                                len > 0 ? ", " : "", r, end);
        r = end;
    }
}

static fsdp_status_t server_run(rdv_server_t *srv, const void *blob, double timeout_s)
{
    int world = srv->info->world_size;
    int cap = srv->nlisten + RDV_PENDING_MAX + world;
    struct pollfd *pfd = calloc((size_t)cap, sizeof(*pfd));
    int *who = calloc((size_t)cap, sizeof(*who)); /* < 0: listener -1-i, else slot or rank */
    fsdp_status_t status = FSDP_OK;

    if (pfd == NULL || who == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        goto out;
    }
    while (srv->njoined < world - 1) {
        double now = now_s(), wake = srv->deadline;
        int n = 0, npending_end, rc;

        if (now >= srv->deadline) {
            char missing[256];

            missing_ranks(srv, missing, sizeof(missing));
            fsdp_error("rendezvous: rank 0 timed out after %.1f s at %s:%d with %d of %d ranks "
                       "joined; missing ranks: %s",
                       timeout_s, srv->info->master_addr, srv->info->master_port, srv->njoined + 1,
                       world, missing);
            for (int r = 1; r < world; r++) {
                if (srv->joined_fd[r] >= 0)
                    answer(srv->joined_fd[r], RDV_TIMEOUT, (uint32_t)srv->njoined + 1, NULL, 0,
                           now_s() + 0.1);
            }
            status = FSDP_ERR_TIMEOUT;
            goto out;
        }
        for (int i = 0; i < srv->nlisten; i++) {
            pfd[n] = (struct pollfd){.fd = srv->listen_fd[i], .events = POLLIN};
            who[n++] = -1 - i;
        }
        for (int i = 0; i < RDV_PENDING_MAX; i++) {
            rdv_pending_t *c = &srv->pending[i];

            if (c->fd < 0)
                continue;
            if (now >= c->expires) {
                drop_pending(srv, c, "no whole request in time");
                continue;
            }
            wake = c->expires < wake ? c->expires : wake;
            pfd[n] = (struct pollfd){.fd = c->fd, .events = POLLIN};
            who[n++] = i;
        }
        npending_end = n;
        for (int r = 1; r < world; r++) {
            if (srv->joined_fd[r] < 0)
                continue;
            pfd[n] = (struct pollfd){.fd = srv->joined_fd[r], .events = POLLIN};
            who[n++] = r;
        }
        rc = poll(pfd, (nfds_t)n, ms_until(wake));
        if (rc < 0 && errno != EINTR) {
            fsdp_error("rendezvous: poll failed: %s", strerror(errno));
            status = FSDP_ERR_IO;
            goto out;
        }
        for (int i = 0; rc > 0 && i < n; i++) {
            if (pfd[i].revents == 0)
                continue;
            if (who[i] < 0)
                server_accept(srv, pfd[i].fd);
            else if (i < npending_end) {
                if (srv->pending[who[i]].fd == pfd[i].fd)
                    server_read(srv, &srv->pending[who[i]]);
            } else if (srv->joined_fd[who[i]] == pfd[i].fd)
                server_check_joined(srv, who[i]);
        }
    }
    for (int r = 1; r < world; r++) {
        unsigned char msg[RDV_ANS_BYTES + FSDP_RENDEZVOUS_BLOB_MAX];

        put32(msg, RDV_MAGIC);
        put32(msg + 4, RDV_OK);
        put32(msg + 8, 0);
        put32(msg + 12, srv->blob_size);
        memcpy(msg + RDV_ANS_BYTES, blob, srv->blob_size);
        if (send_all(srv->joined_fd[r], msg, RDV_ANS_BYTES + srv->blob_size, srv->deadline) != 0) {
            fsdp_error("rendezvous: rank 0 could not send the blob to rank %d: %s", r,
                       strerror(errno));
            status = FSDP_ERR_RANK_FAILED;
        }
    }
out:
    free(who);
    free(pfd);
    return status;
}

static fsdp_status_t rendezvous_serve(const fsdp_launch_info_t *info, const char *token,
                                      double timeout_s, const void *blob, size_t blob_size)
{
    rdv_server_t srv = {.info = info,
                        .token = (const unsigned char *)token,
                        .token_len = token != NULL ? strlen(token) : 0,
                        .blob_size = (uint32_t)blob_size,
                        .deadline = now_s() + timeout_s};
    fsdp_status_t status;

    srv.pending = calloc(RDV_PENDING_MAX, sizeof(*srv.pending));
    srv.joined_fd = malloc((size_t)info->world_size * sizeof(*srv.joined_fd));
    if (srv.pending == NULL || srv.joined_fd == NULL) {
        status = FSDP_ERR_NO_MEMORY;
        goto err_free;
    }
    for (int i = 0; i < RDV_PENDING_MAX; i++)
        srv.pending[i].fd = -1;
    for (int r = 0; r < info->world_size; r++)
        srv.joined_fd[r] = -1;
    status = server_listen(&srv);
    if (status == FSDP_OK)
        status = server_run(&srv, blob, timeout_s);
    warn_summary(&srv);
    if (status == FSDP_OK)
        fsdp_info("rendezvous: rank 0 served %d ranks at %s:%d", info->world_size,
                  info->master_addr, info->master_port);
    for (int r = 0; r < info->world_size; r++)
        close_fd(&srv.joined_fd[r]);
    for (int i = 0; i < RDV_PENDING_MAX; i++)
        close_fd(&srv.pending[i].fd);
    for (int i = 0; i < srv.nlisten; i++)
        close_fd(&srv.listen_fd[i]);
err_free:
    free(srv.joined_fd);
    free(srv.pending);
    return status;
}

/* ---- the other ranks ---- */

/* One connection attempt to any of rank 0's addresses. The socket, or -1 with errno. */
static int client_connect(const struct addrinfo *res, double deadline)
{
    int last_errno = ECONNREFUSED;

    for (const struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        int fd =
            socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        int err = 0;
        socklen_t len = sizeof(err);

        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            return fd;
        if (errno == EINPROGRESS) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            int rc;

            do
                rc = poll(&pfd, 1, ms_until(deadline));
            while (rc < 0 && errno == EINTR);
            if (rc > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0)
                return fd;
            errno = rc == 0 ? ETIMEDOUT : err != 0 ? err : errno;
        }
        last_errno = errno;
        close(fd);
    }
    errno = last_errno;
    return -1;
}

static void sleep_until(double t)
{
    double d = t - now_s();
    struct timespec ts;

    if (d <= 0)
        return;
    ts.tv_sec = (time_t)d;
    ts.tv_nsec = (long)((d - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}

static fsdp_status_t refused(const fsdp_launch_info_t *info, uint32_t code, uint32_t detail,
                             size_t blob_size)
{
    int rank = info->rank;

    switch (code) {
    case RDV_BAD_TOKEN:
        fsdp_error("rendezvous: rank 0 refused rank %d: job token rejected (set the same "
                   "FSDP_JOB_TOKEN on every rank)",
                   rank);
        break;
    case RDV_RANK_JOINED:
        fsdp_error("rendezvous: rank 0 refused rank %d: rank %d already joined", rank, rank);
        break;
    case RDV_BAD_WORLD:
        fsdp_error("rendezvous: rank 0 refused rank %d: world size %d does not match the "
                   "server's %u",
                   rank, info->world_size, detail);
        break;
    case RDV_BAD_RANK:
        fsdp_error("rendezvous: rank 0 refused rank %d: out of range for its world size %u", rank,
                   detail);
        break;
    case RDV_BAD_BLOB_SIZE:
        fsdp_error("rendezvous: rank 0 refused rank %d: blob size %zu does not match the "
                   "server's %u",
                   rank, blob_size, detail);
        break;
    case RDV_BAD_VERSION:
        fsdp_error("rendezvous: rank 0 refused rank %d: protocol version %u does not match "
                   "the server's %u",
                   rank, RDV_VERSION, detail);
        break;
    case RDV_TIMEOUT:
        fsdp_error("rendezvous: rank 0 timed out with %u of %d ranks joined (rank %d among "
                   "them)",
                   detail, info->world_size, rank);
        return FSDP_ERR_TIMEOUT;
    default:
        fsdp_error("rendezvous: rank 0 answered rank %d with unknown code %u", rank, code);
        return FSDP_ERR_BACKEND;
    }
    return FSDP_ERR_INVALID_PARAM;
}

/* Judges the header of rank 0's answer: FSDP_OK when the blob of blob_size bytes follows. */
static fsdp_status_t client_check_answer(const fsdp_launch_info_t *info, const unsigned char *ans,
                                         size_t blob_size)
{
    uint32_t code = get32(ans + 4), len = get32(ans + 12);

    if (get32(ans) != RDV_MAGIC) {
        fsdp_error("rendezvous: rank %d got a malformed answer from %s:%d (not a libfsdp "
                   "rendezvous?)",
                   info->rank, info->master_addr, info->master_port);
        return FSDP_ERR_BACKEND;
    }
    if (code != RDV_OK)
        return refused(info, code, get32(ans + 8), blob_size);
    if (len != blob_size) {
        fsdp_error("rendezvous: rank %d was offered %u blob bytes by rank 0, not %zu", info->rank,
                   len, blob_size);
        return FSDP_ERR_BACKEND;
    }
    return FSDP_OK;
}

static fsdp_status_t rendezvous_join(const fsdp_launch_info_t *info, const char *token,
                                     double timeout_s, void *blob, size_t blob_size)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    size_t token_len = token != NULL ? strlen(token) : 0;
    unsigned char req[RDV_REQ_BYTES + FSDP_RENDEZVOUS_TOKEN_MAX];
    unsigned char ans[RDV_ANS_BYTES + FSDP_RENDEZVOUS_BLOB_MAX];
    double start = now_s(), deadline = start + timeout_s;
    const char *last = "connection refused";
    char port[8];
    int rc, fd = -1;
    ssize_t n;
    fsdp_status_t status;

    snprintf(port, sizeof(port), "%d", info->master_port);
    while ((rc = getaddrinfo(info->master_addr, port, &hints, &res)) == EAI_AGAIN &&
           now_s() + RDV_RETRY_S < deadline)
        sleep_until(now_s() + RDV_RETRY_S);
    if (rc != 0) {
        fsdp_error("rendezvous: rank %d cannot resolve master address %s: %s", info->rank,
                   info->master_addr, gai_strerror(rc));
        return rc == EAI_AGAIN ? FSDP_ERR_TIMEOUT : FSDP_ERR_INVALID_PARAM;
    }
    put32(req, RDV_MAGIC);
    put32(req + 4, RDV_VERSION << 16);
    put32(req + 8, (uint32_t)info->rank);
    put32(req + 12, (uint32_t)info->world_size);
    put32(req + 16, (uint32_t)blob_size);
    put32(req + 20, (uint32_t)token_len);
    if (token_len > 0)
        memcpy(req + RDV_REQ_BYTES, token, token_len);

    for (;;) {
        if (now_s() >= deadline) {
            fsdp_error("rendezvous: rank %d timed out after %.1f s: rank 0 at %s:%d %s", info->rank,
                       timeout_s, info->master_addr, info->master_port,
                       fd >= 0 ? "did not answer (other ranks missing)" : last);
            status = FSDP_ERR_TIMEOUT;
            goto out;
        }
        close_fd(&fd);
        fd = client_connect(res, deadline);
        if (fd < 0) {
            last = "could not be reached (rank 0 not up?)";
            sleep_until(now_s() + RDV_RETRY_S < deadline ? now_s() + RDV_RETRY_S : deadline);
            continue;
        }
        if (send_all(fd, req, RDV_REQ_BYTES + token_len, deadline) != 0) {
            last = "dropped the connection";
            continue;
        }
        n = recv_all(fd, ans, RDV_ANS_BYTES, deadline);
        if (n < 0 && errno == ETIMEDOUT)
            continue; /* reported above, with fd still open */
        if (n > 0 && n < RDV_ANS_BYTES) {
            fsdp_error("rendezvous: rank %d got a short answer from rank 0 at %s:%d (%zd of "
                       "%d bytes, then the connection closed)",
                       info->rank, info->master_addr, info->master_port, n, RDV_ANS_BYTES);
            status = FSDP_ERR_BACKEND;
            goto out;
        }
        if (n <= 0) {
            /* rank 0 closed without a word (too busy, or a stale listener): try again */
            last = "closed the connection without an answer";
            close_fd(&fd);
            sleep_until(now_s() + RDV_RETRY_S < deadline ? now_s() + RDV_RETRY_S : deadline);
            continue;
        }
        break;
    }
    status = client_check_answer(info, ans, blob_size);
    if (status != FSDP_OK)
        goto out;
    n = recv_all(fd, ans + RDV_ANS_BYTES, blob_size, deadline);
    if (n != (ssize_t)blob_size) {
        fsdp_error("rendezvous: rank %d got %zd of the %zu blob bytes from rank 0", info->rank, n,
                   blob_size);
        status = n < 0 && errno == ETIMEDOUT ? FSDP_ERR_TIMEOUT : FSDP_ERR_BACKEND;
        goto out;
    }
    memcpy(blob, ans + RDV_ANS_BYTES, blob_size);
    fsdp_debug("rendezvous: rank %d received the blob in %.3f s", info->rank, now_s() - start);
out:
    close_fd(&fd);
    freeaddrinfo(res);
    return status;
}

fsdp_status_t fsdp_rendezvous(const fsdp_launch_info_t *info, const char *token, double timeout_s,
                              void *blob, size_t blob_size)
{
    if (info == NULL || blob == NULL || blob_size == 0 || blob_size > FSDP_RENDEZVOUS_BLOB_MAX) {
        fsdp_error("rendezvous: info and blob are required, blob size %zu must be in [1, %d]",
                   blob_size, FSDP_RENDEZVOUS_BLOB_MAX);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (!(timeout_s > 0) || timeout_s > 1e9) {
        fsdp_error("rendezvous: timeout %g s is not allowed: expected > 0 and finite", timeout_s);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (token != NULL && strlen(token) > FSDP_RENDEZVOUS_TOKEN_MAX) {
        fsdp_error("rendezvous: the job token has %zu bytes, at most %d are allowed", strlen(token),
                   FSDP_RENDEZVOUS_TOKEN_MAX);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (info->world_size < 1 || info->rank < 0 || info->rank >= info->world_size ||
        info->master_port < 1 || info->master_port > 65535 ||
        memchr(info->master_addr, '\0', sizeof(info->master_addr)) == NULL ||
        info->master_addr[0] == '\0') {
        fsdp_error("rendezvous: rank %d of world size %d at port %d is not allowed: expected "
                   "0 <= rank < world size, a master address and a port in [1, 65535]",
                   info->rank, info->world_size, info->master_port);
        return FSDP_ERR_INVALID_PARAM;
    }
    if (info->world_size == 1)
        return FSDP_OK;
    if (info->rank == 0)
        return rendezvous_serve(info, token, timeout_s, blob, blob_size);
    return rendezvous_join(info, token, timeout_s, blob, blob_size);
}
