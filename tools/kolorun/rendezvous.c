/*
 * rendezvous.c — the rendezvous directory: the private directory where the
 * ranks meet (unless they meet through Redis, redis.c), the KOLO_RENDEZVOUS
 * every rank gets, and the removal of the directory and of the shared
 * memory the ranks left behind once the job is over.
 */
#define _GNU_SOURCE

#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "procs.h"

/* How deep kolorun_rmtree_at goes into what the ranks left behind. */
#define KOLORUN_RMTREE_DEPTH 64

/* Creates a fresh private directory and stores its absolute path. An
 * absolute path, because a rank may change its working directory before it
 * looks for its peers. */
int kolorun_rdv_create(kolorun_t *k)
{
    const char *base = k->opts.rdv_base ? k->opts.rdv_base : getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    size_t n = strlen(base);
    while (n > 1 && base[n - 1] == '/')
        n--;
    char *tmpl = kolorun_strdupf("%.*s/kolo-rdv-XXXXXX", (int)n, base);
    if (!tmpl) {
        kolorun_say("out of memory");
        return -1;
    }
    if (!mkdtemp(tmpl)) {
        kolorun_say("cannot create the rendezvous directory %s: %s", tmpl,
                    strerror(errno));
        free(tmpl);
        return -1;
    }
    k->rdv_dir = realpath(tmpl, NULL);
    if (!k->rdv_dir) {
        k->rdv_dir = tmpl; /* still removable by the path we made */
        return 0;
    }
    free(tmpl);
    return 0;
}

/* Removes directory `name` (relative to dirfd) and everything in it,
 * following no symbolic link: ranks may leave anything there. */
static int kolorun_rmtree_at(int dirfd, const char *name, int depth)
{
    if (depth > KOLORUN_RMTREE_DEPTH) {
        errno = ELOOP;
        return -1;
    }
    /* Empty (ranks that end cleanly leave nothing): no descriptor needed,
     * which counts when kolorun ran out of them. */
    if (unlinkat(dirfd, name, AT_REMOVEDIR) == 0)
        return 0;
    int fd = openat(dirfd, name,
                    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    /* A rank may have made a directory read-only; it is ours to remove. */
    (void)fchmod(fd, S_IRWXU);
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return -1;
    }
    /* Removing entries while reading the directory may make readdir skip
     * some on some file systems; a few passes settle it. */
    for (int pass = 0; pass < 3; pass++) {
        int removed = 0;
        struct dirent *e;
        rewinddir(d);
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            if (unlinkat(fd, e->d_name, 0) == 0 ||
                ((errno == EISDIR || errno == EPERM) &&
                 kolorun_rmtree_at(fd, e->d_name, depth + 1) == 0))
                removed++;
        }
        if (unlinkat(dirfd, name, AT_REMOVEDIR) == 0) {
            closedir(d);
            return 0;
        }
        if (errno != ENOTEMPTY && errno != EEXIST)
            break;
        if (!removed)
            break;
    }
    int saved = errno;
    closedir(d);
    errno = saved;
    return -1;
}

int kolorun_rmtree(const char *path)
{
    return kolorun_rmtree_at(AT_FDCWD, path, 0);
}

/* Removes the shared-memory segments (ops/shm) the job's ranks left in
 * /dev/shm. Ranks unlink them as soon as every member has attached, so only
 * a rank killed during start-up leaves one. Their names begin with
 * "kolo-" and the FNV-1a hash of the job's KOLO_RENDEZVOUS, as in
 * shm_ops.c. */
static void kolorun_shm_sweep(const kolorun_t *k, const char *rendezvous)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    char prefix[32];
    DIR *d;
    struct dirent *e;

    for (const char *p = rendezvous; *p; p++) {
        h ^= (unsigned char)*p;
        h *= 0x100000001b3ULL;
    }
    snprintf(prefix, sizeof(prefix), "kolo-%08x-", (unsigned)(h & 0xffffffffu));
    d = opendir("/dev/shm");
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 &&
            unlinkat(dirfd(d), e->d_name, 0) == 0 && k->opts.verbose)
            kolorun_say("removed leftover shared memory /dev/shm/%s", e->d_name);
    closedir(d);
}

/* The KOLO_RENDEZVOUS every rank gets (NULL: out of memory). */
char *kolorun_rendezvous(const kolorun_t *k)
{
    if (k->redis_addr[0])
        return kolorun_strdupf("redis:%s/%s", k->redis_addr, k->job_id);
    return kolorun_strdupf("file:%s", k->rdv_dir);
}

void kolorun_rdv_remove(kolorun_t *k)
{
    char *rdv = k->redis_addr[0] || k->rdv_dir ? kolorun_rendezvous(k) : NULL;
    if (rdv) {
        kolorun_shm_sweep(k, rdv);
        free(rdv);
    }
    if (!k->rdv_dir)
        return;
    if (kolorun_rmtree_at(AT_FDCWD, k->rdv_dir, 0) != 0 && errno != ENOENT)
        kolorun_say("warning: cannot remove the rendezvous directory %s: %s",
                    k->rdv_dir, strerror(errno));
    else if (k->opts.verbose)
        kolorun_say("removed rendezvous directory %s", k->rdv_dir);
    free(k->rdv_dir);
    k->rdv_dir = NULL;
}

/* Writes key = value into the rendezvous directory as runtime/store.c
 * reads it: a file per key ('/' written as '.'), written whole and renamed
 * into place. 0, or -1 having said why. */
int kolorun_rdv_dir_set(const kolorun_t *k, const char *key,
                        const char *value)
{
    char *path = kolorun_strdupf("%s/%s", k->rdv_dir, key);
    char *tmp = path ? kolorun_strdupf("%s.tmp%ld", path, (long)getpid())
                     : NULL;
    int rc = -1;
    if (!tmp) {
        kolorun_say("out of memory");
        goto out;
    }
    /* the key's '/' as '.', in both names (the directory keeps its own) */
    for (size_t i = strlen(k->rdv_dir) + 1; path[i]; i++)
        if (path[i] == '/')
            path[i] = tmp[i] = '.';
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int ok = fd >= 0 && kolorun_write_all(fd, value, strlen(value)) == 0;
    if (fd >= 0 && close(fd) != 0)
        ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        kolorun_say("cannot write %s in the rendezvous directory: %s", path,
                    strerror(errno));
        unlink(tmp);
    } else {
        rc = 0;
    }
out:
    free(tmp);
    free(path);
    return rc;
}
