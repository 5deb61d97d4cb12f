/* The library's file-system helpers (lib/io/fs.c): an atomic write leaves the exact content and
 * no temporary on success, the target untouched and no temporary on failure, with one error
 * naming the target; a directory sync succeeds on a directory and names what it could not sync. */
#include "io/fs.h"

#include <fsdp/log.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

static int log_count;
static char log_last[1024];

static void capture_log(fsdp_log_level_t level, const char *file, int line, const char *func,
                        const char *msg, void *arg)
{
    if (level != FSDP_LOG_ERROR)
        return;
    log_count++;
    snprintf(log_last, sizeof(log_last), "%s", msg);
}

/* One error line was logged since the last reset, naming `label` first and containing `needle`. */
static int logged_once(const char *label, const char *needle)
{
    size_t n = strlen(label);
    int ok = log_count == 1 && strncmp(log_last, label, n) == 0 && log_last[n] == ':' &&
             strstr(log_last, needle) != NULL;
    if (!ok)
        fprintf(stderr, "\n    expected one error naming '%s' with '%s'; got %d, last: %s\n", label,
                needle, log_count, log_last);
    log_count = 0;
    log_last[0] = '\0';
    return ok;
}

static char *make_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[PATH_MAX];

    snprintf(tmpl, sizeof(tmpl), "%s/fsdp_fs_XXXXXX", base != NULL ? base : "/tmp");
    if (mkdtemp(tmpl) == NULL) {
        perror("mkdtemp");
        abort();
    }
    return strdup(tmpl);
}

/* The names in dir other than . and ..; the number of them, -1 if dir cannot be read. */
static int dir_names(const char *dir, char *names, size_t size)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;

    names[0] = '\0';
    if (d == NULL)
        return -1;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        n++;
        strncat(names, de->d_name, size - strlen(names) - 1);
        strncat(names, ",", size - strlen(names) - 1);
    }
    closedir(d);
    return n;
}

/* The whole file into buf; its length, -1 if it cannot be read. */
static long read_file(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "rb");
    size_t n;

    if (f == NULL)
        return -1;
    n = fread(buf, 1, size, f);
    fclose(f);
    return (long)n;
}

static void test_write_exact(void)
{
    static const char a[] = "first chunk, ", b[] = "", c[] = "last\0with a NUL";
    const fsdp_fs_chunk_t chunks[] = {{a, sizeof(a) - 1}, {b, 0}, {c, sizeof(c)}};
    char *dir = make_tmpdir(), path[PATH_MAX], names[256], buf[256];
    long len;

    snprintf(path, sizeof(path), "%s/out.bin", dir);
    CU_ASSERT_EQUAL(fsdp_fs_write_atomic(path, chunks, 3), FSDP_OK);
    len = read_file(path, buf, sizeof(buf));
    CU_ASSERT_EQUAL(len, (long)(sizeof(a) - 1 + sizeof(c)));
    CU_ASSERT(len > 0 && memcmp(buf, a, sizeof(a) - 1) == 0 &&
              memcmp(buf + sizeof(a) - 1, c, sizeof(c)) == 0);
    CU_ASSERT_EQUAL(dir_names(dir, names, sizeof(names)), 1);
    CU_ASSERT_STRING_EQUAL(names, "out.bin,");

    /* a second write replaces the content whole, shorter as it is */
    {
        const fsdp_fs_chunk_t one = {"xy", 2};
        CU_ASSERT_EQUAL(fsdp_fs_write_atomic(path, &one, 1), FSDP_OK);
    }
    CU_ASSERT_EQUAL(read_file(path, buf, sizeof(buf)), 2);
    CU_ASSERT(memcmp(buf, "xy", 2) == 0);
    CU_ASSERT_EQUAL(dir_names(dir, names, sizeof(names)), 1);

    /* no chunks: an empty file */
    CU_ASSERT_EQUAL(fsdp_fs_write_atomic(path, NULL, 0), FSDP_OK);
    CU_ASSERT_EQUAL(read_file(path, buf, sizeof(buf)), 0);

    unlink(path);
    rmdir(dir);
    free(dir);
}

static void test_write_fails_cleanly(void)
{
    const fsdp_fs_chunk_t chunk = {"new", 3};
    char *dir = make_tmpdir(), path[PATH_MAX], sub[PATH_MAX + 16], names[256], buf[16];

    snprintf(path, sizeof(path), "%s/keep.txt", dir);
    {
        const fsdp_fs_chunk_t old = {"old", 3};
        CU_ASSERT_EQUAL_FATAL(fsdp_fs_write_atomic(path, &old, 1), FSDP_OK);
    }
    log_count = 0;

    /* a missing directory */
    snprintf(sub, sizeof(sub), "%s/nodir/x.txt", dir);
    CU_ASSERT_EQUAL(fsdp_fs_write_atomic(sub, &chunk, 1), FSDP_ERR_IO);
    CU_ASSERT(logged_once(sub, strerror(ENOENT)));

    /* a parent that is a file */
    snprintf(sub, sizeof(sub), "%s/keep.txt/x.txt", dir);
    CU_ASSERT_EQUAL(fsdp_fs_write_atomic(sub, &chunk, 1), FSDP_ERR_IO);
    CU_ASSERT(logged_once(sub, strerror(ENOTDIR)));

    /* a read-only directory (root ignores the mode bits, so only as another user) */
    if (geteuid() != 0) {
        CU_ASSERT_EQUAL_FATAL(chmod(dir, 0500), 0);
        CU_ASSERT_EQUAL(fsdp_fs_write_atomic(path, &chunk, 1), FSDP_ERR_IO);
        CU_ASSERT(logged_once(path, strerror(EACCES)));
        CU_ASSERT_EQUAL(chmod(dir, 0700), 0);
    }

    /* the rename fails: the target is a non-empty directory */
    snprintf(sub, sizeof(sub), "%s/full", dir);
    CU_ASSERT_EQUAL_FATAL(mkdir(sub, 0700), 0);
    {
        char inner[PATH_MAX + 32];
        const fsdp_fs_chunk_t x = {"x", 1};
        snprintf(inner, sizeof(inner), "%s/inner", sub);
        CU_ASSERT_EQUAL_FATAL(fsdp_fs_write_atomic(inner, &x, 1), FSDP_OK);
        CU_ASSERT_EQUAL(fsdp_fs_write_atomic(sub, &chunk, 1), FSDP_ERR_IO);
        CU_ASSERT(logged_once(sub, "cannot rename"));
        unlink(inner);
    }
    rmdir(sub);

    /* nothing left behind, the target as it was */
    CU_ASSERT_EQUAL(dir_names(dir, names, sizeof(names)), 1);
    CU_ASSERT_STRING_EQUAL(names, "keep.txt,");
    CU_ASSERT_EQUAL(read_file(path, buf, sizeof(buf)), 3);
    CU_ASSERT(memcmp(buf, "old", 3) == 0);

    unlink(path);
    rmdir(dir);
    free(dir);
}

static void test_sync_dir(void)
{
    char *dir = make_tmpdir(), sub[PATH_MAX + 16];

    CU_ASSERT_EQUAL(fsdp_fs_sync_dir(dir), FSDP_OK);
    CU_ASSERT_EQUAL(fsdp_fs_sync_dir("/"), FSDP_OK);
    log_count = 0;
    snprintf(sub, sizeof(sub), "%s/none", dir);
    CU_ASSERT_EQUAL(fsdp_fs_sync_dir(sub), FSDP_ERR_IO);
    CU_ASSERT(logged_once(sub, strerror(ENOENT)));
    rmdir(dir);
    free(dir);
}

/* The one open of a file to read: a regular file opens, blocking again; a FIFO, a device and a
 * directory are refused at once, each with one line saying what it is; a missing file is logged,
 * or with quiet_missing answered FSDP_ERR_NOT_FOUND alone. */
static void test_open_read(void)
{
    char *dir = make_tmpdir(), path[PATH_MAX + 16], fifo[PATH_MAX + 16];
    struct stat st;
    FILE *f = NULL;
    char line[16];
    int fd = -1;

    snprintf(path, sizeof(path), "%s/file", dir);
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    f = fopen(path, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs("latest\n", f);
    fclose(f);
    CU_ASSERT_FATAL(mkfifo(fifo, 0600) == 0);

    log_count = 0;
    CU_ASSERT_EQUAL_FATAL(fsdp_fs_open_read(path, 0, &fd, &st), FSDP_OK);
    CU_ASSERT_EQUAL(st.st_size, 7);
    CU_ASSERT_EQUAL(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
    close(fd);
    CU_ASSERT_EQUAL_FATAL(fsdp_fs_fopen_read(path, 0, &f), FSDP_OK);
    CU_ASSERT(fgets(line, sizeof(line), f) != NULL && strcmp(line, "latest\n") == 0);
    fclose(f);
    CU_ASSERT_EQUAL(log_count, 0);

    alarm(10); /* a blocking open would hang: fail instead */
    CU_ASSERT_EQUAL(fsdp_fs_open_read(fifo, 0, &fd, &st), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT(logged_once(fifo, "is a FIFO, not a regular file"));
    CU_ASSERT_EQUAL(fsdp_fs_fopen_read(fifo, 1, &f), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT(logged_once(fifo, "is a FIFO, not a regular file"));
    alarm(0);
    CU_ASSERT_EQUAL(fsdp_fs_open_read("/dev/zero", 0, &fd, &st), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT(logged_once("/dev/zero", "is a device, not a regular file"));
    CU_ASSERT_EQUAL(fsdp_fs_open_read(dir, 0, &fd, &st), FSDP_ERR_INVALID_PARAM);
    CU_ASSERT(logged_once(dir, "is a directory, not a regular file"));

    snprintf(path, sizeof(path), "%s/none", dir);
    CU_ASSERT_EQUAL(fsdp_fs_open_read(path, 0, &fd, &st), FSDP_ERR_IO);
    CU_ASSERT(logged_once(path, strerror(ENOENT)));
    CU_ASSERT_EQUAL(fsdp_fs_fopen_read(path, 1, &f), FSDP_ERR_NOT_FOUND);
    CU_ASSERT_EQUAL(log_count, 0);

    unlink(fifo);
    snprintf(path, sizeof(path), "%s/file", dir);
    unlink(path);
    rmdir(dir);
    free(dir);
}

int main(void)
{
    static const fsdp_test_case_t tests[] = {
        {"an atomic write leaves exactly its content and no temporary", test_write_exact},
        {"a failed atomic write leaves the target and no temporary", test_write_fails_cleanly},
        {"a directory sync", test_sync_dir},
        {"a file opened to read: regular only, a FIFO never waited on", test_open_read},
        {NULL, NULL},
    };
    fsdp_log_set_handler(capture_log, NULL);
    return fsdp_test_run("fs", tests);
}
