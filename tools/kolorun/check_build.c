/*
 * check_build.c — --check-build: what this kolo has, in horovodrun's layout
 *
 * The backends are what libkolo says (kolo_built), found as the Python
 * binding finds it: KOLO_LIBRARY, else the build tree next to this kolorun
 * (.libs/), else the libdir kolo was configured for, else the loader's
 * path; where it cannot be loaded, what ./configure found, saying so. The
 * frameworks are what a Python interpreter imports: KOLO_PYTHON, else the
 * one ./configure found (the bindings' own), else python3 on PATH. A GPU
 * is "visible now" when the CUDA driver counts one (CUDA_VISIBLE_DEVICES
 * applies).
 */
#define _GNU_SOURCE

#include "config.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "built.h"
#include "cmdline.h"

#define KOLORUN_PROBE_MS 60000 /* importing torch takes seconds; a bound */

typedef int (*kolorun_built_fn)(const char *);

static void *kolorun_libkolo(char *path, size_t n, char *why, size_t wn)
{
    char self[4096], cand[5][4200];
    int nc = 0;
    const char *env = getenv("KOLO_LIBRARY");
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (env && *env)
        snprintf(cand[nc++], sizeof cand[0], "%s", env);
    if (len > 0) {
        self[len] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            /* a build tree's .libs; beside kolorun in pip's kolo/_native */
            snprintf(cand[nc++], sizeof cand[0], "%s/.libs/libkolo.so.0", self);
            snprintf(cand[nc++], sizeof cand[0], "%s/libkolo.so.0", self);
        }
    }
#ifdef KOLO_LIBDIR
    snprintf(cand[nc++], sizeof cand[0], "%s/libkolo.so.0", KOLO_LIBDIR);
#endif
    snprintf(cand[nc++], sizeof cand[0], "libkolo.so.0");
    why[0] = '\0';
    for (int i = 0; i < nc; i++) {
        if (strchr(cand[i], '/') && access(cand[i], F_OK) != 0) {
            if (i == 0 && env && *env) {
                snprintf(why, wn, "KOLO_LIBRARY=%.400s: %s", env, strerror(errno));
                return NULL; /* KOLO_LIBRARY names the one to use */
            }
            continue;
        }
        void *h = dlopen(cand[i], RTLD_NOW | RTLD_LOCAL);
        if (h && dlsym(h, "kolo_built")) {
            snprintf(path, n, "%.4199s", cand[i]);
            return h;
        }
        snprintf(why, wn, "%s", h ? "it has no kolo_built" : dlerror());
        if (h)
            dlclose(h);
        if (env && *env)
            break; /* KOLO_LIBRARY names the one to use */
    }
    if (!why[0])
        snprintf(why, wn, "not found");
    return NULL;
}

/* What ./configure found, where libkolo cannot be asked. */
static int kolorun_configured(const char *what)
{
#ifdef KOLO_HAVE_GPU
    if (strcmp(what, "nccl") == 0)
        return 1;
#endif
    return kolo__built(what);
}

/* Runs argv with stdout into buf (stderr to /dev/null), for at most
 * KOLORUN_PROBE_MS; 0 when it ran and exited 0. */
static int kolorun_capture(char *const argv[], char *buf, size_t n)
{
    int p[2];
    size_t used = 0;
    buf[0] = '\0';
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        int nul = open("/dev/null", O_RDWR);
        if (nul >= 0) {
            dup2(nul, STDIN_FILENO);
            dup2(nul, STDERR_FILENO);
        }
        dup2(p[1], STDOUT_FILENO);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    int64_t deadline = kolorun_now_ms() + KOLORUN_PROBE_MS;
    for (;;) {
        struct pollfd pf = {p[0], POLLIN, 0};
        int64_t left = deadline - kolorun_now_ms();
        if (left <= 0) {
            kill(pid, SIGKILL);
            break;
        }
        int r = poll(&pf, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            continue;
        ssize_t got = read(p[0], buf + used, n - 1 - used);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        used += (size_t)got;
        if (used >= n - 1)
            break;
    }
    buf[used] = '\0';
    close(p[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* The version after "name " on a line of the probe's output, or NULL. */
static const char *kolorun_probe_line(const char *out, const char *name,
                                      char *ver, size_t n)
{
    size_t len = strlen(name);
    for (const char *p = out; *p != '\0';) {
        const char *nl = strchr(p, '\n');
        if (strncmp(p, name, len) == 0 && p[len] == ' ') {
            snprintf(ver, n, "%.*s", (int)strcspn(p + len + 1, "\n"), p + len + 1);
            return ver;
        }
        if (!nl)
            break;
        p = nl + 1;
    }
    return NULL;
}

typedef int (*kolorun_cu_int_fn)(unsigned);
typedef int (*kolorun_cu_count_fn)(int *);
typedef int (*kolorun_cu_name_fn)(int, const char **);

/* "yes, N devices" or "no (why)": what the CUDA driver counts now. */
static void kolorun_gpu_visible(char *out, size_t n)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(out, n, "no (no CUDA driver here: libcuda.so.1 cannot be "
                 "loaded)");
        return;
    }
    kolorun_cu_int_fn cu_init = (kolorun_cu_int_fn)dlsym(h, "cuInit");
    kolorun_cu_count_fn cu_count = (kolorun_cu_count_fn)dlsym(h, "cuDeviceGetCount");
    kolorun_cu_name_fn cu_name = (kolorun_cu_name_fn)dlsym(h, "cuGetErrorName");
    int count = 0, rc = cu_init && cu_count ? cu_init(0) : -1;
    if (rc == 0)
        rc = cu_count(&count);
    if (rc == 0 && count > 0) {
        snprintf(out, n, "yes, %d device%s", count, count == 1 ? "" : "s");
    } else if (rc == 0) {
        snprintf(out, n, "no (the CUDA driver counts no device)");
    } else {
        const char *name = NULL;
        if (!cu_name || rc < 0 || cu_name(rc, &name) != 0 || !name)
            name = "an error";
        snprintf(out, n, "no (cuInit: %s)", name);
    }
    dlclose(h);
}

/* What --check-build found, before anything is printed. */
typedef struct kolorun_build {
    char libpath[4200]; /* libkolo, where it was loaded */
    char why[512];      /* why it could not be */
    kolorun_built_fn built; /* its kolo_built; NULL: not loaded */
    int gloo, mpi, shm, cuda, nccl;
    const char *python; /* the interpreter asked about frameworks */
    int py;             /* it ran */
    char probe[4096];   /* what it printed */
    char gpu[256];
} kolorun_build_t;

/* The Python interpreter to ask: KOLO_PYTHON, else the one ./configure
 * found, else python3 on PATH. */
static const char *kolorun_python(void)
{
    const char *python = getenv("KOLO_PYTHON");
#ifdef KOLO_CONFIGURED_PYTHON
    if ((!python || !*python) && strcmp(KOLO_CONFIGURED_PYTHON, ":") != 0 &&
        KOLO_CONFIGURED_PYTHON[0] != '\0')
        python = KOLO_CONFIGURED_PYTHON;
#endif
    return python && *python ? python : "python3";
}

/* Which frameworks the interpreter imports: a line "name version" each,
 * "name- Error" where it cannot. */
static void kolorun_probe_python(kolorun_build_t *b)
{
    char *pyargv[] = {
        (char *)b->python, "-c",
        "import importlib\n"
        "for m in ('torch', 'numpy', 'kolo'):\n"
        "    try:\n"
        "        v = getattr(importlib.import_module(m), '__version__', '?')\n"
        "        print(m, v)\n"
        "    except Exception as e:\n"
        "        print(m + '-', type(e).__name__)\n",
        NULL};
    b->py = kolorun_capture(pyargv, b->probe, sizeof b->probe) == 0;
}

/* The backends: libkolo's answer, else what ./configure found. */
static void kolorun_backends(kolorun_build_t *b)
{
    int (*has)(const char *) = b->built ? b->built : kolorun_configured;
    b->gloo = has("gloo");
    b->mpi = has("mpi");
    b->shm = has("shm");
    b->cuda = has("cuda");
    b->nccl = has("nccl");
}

static void kolorun_print_frameworks(const kolorun_build_t *b)
{
    char tver[128], nver[128];
    const char *torch = b->py ? kolorun_probe_line(b->probe, "torch", tver, sizeof tver) : NULL;
    const char *numpy = b->py ? kolorun_probe_line(b->probe, "numpy", nver, sizeof nver) : NULL;
    printf("Available Frameworks:\n");
    printf("    [%c] PyTorch%s%s\n", torch ? 'X' : ' ', torch ? " " : "",
           torch ? torch : "");
    printf("    [%c] NumPy%s%s\n", numpy ? 'X' : ' ', numpy ? " " : "",
           numpy ? numpy : "");
}

static void kolorun_print_backends(const kolorun_build_t *b)
{
    int nccl = b->nccl;
    printf("\nAvailable Controllers:\n");
    printf("    [%c] shm\n", b->shm ? 'X' : ' ');
    printf("    [%c] Gloo\n", b->gloo ? 'X' : ' ');
    printf("    [%c] MPI\n", b->mpi ? 'X' : ' ');
    printf("\nAvailable Tensor Operations:\n");
    if (nccl > 1)
        printf("    [X] NCCL %d.%d.%d\n", nccl >= 10000 ? nccl / 10000 : nccl / 1000,
               nccl >= 10000 ? nccl % 10000 / 100 : nccl % 1000 / 100, nccl % 100);
    else
        printf("    [%c] NCCL\n", nccl ? 'X' : ' ');
    printf("    [%c] shm\n", b->shm ? 'X' : ' ');
    printf("    [%c] Gloo\n", b->gloo ? 'X' : ' ');
    printf("    [%c] MPI\n", b->mpi ? 'X' : ' ');
    printf("    [%c] CUDA\n", b->cuda ? 'X' : ' ');
}

/* What a job uses when KOLO_CONTROLLER and KOLO_CPU_OPERATIONS are not
 * set (ops/registry.c chooses; --gloo sets both to gloo). */
static void kolorun_print_defaults(const kolorun_build_t *b)
{
    const char *net = b->gloo ? "Gloo" : b->mpi ? "MPI (under mpirun)" : "none";
    printf("\nWhat negotiates and moves host tensors (KOLO_CONTROLLER,\n"
           "KOLO_CPU_OPERATIONS unset):\n");
    printf("    kolorun -np N, one host:     %s\n", b->shm ? "shm" : net);
    printf("    kolorun across hosts:        %s\n", net);
    printf("    kolorun --gloo:              %s\n", b->gloo ? "Gloo" : "(no Gloo)");
    printf("    kolorun --mpi, mpirun:       %s\n", b->mpi ? "MPI" : "(no MPI)");
}

/* The GPU, and where the answers came from. */
static void kolorun_print_notes(const kolorun_build_t *b)
{
    char kver[128];
    printf("\nGPU visible now: %s\n", b->gpu);
    if (b->built)
        printf("(libkolo: %s)\n", b->libpath);
    else
        printf("(libkolo could not be loaded: %s; this is what ./configure "
               "found)\n", b->why);
    if (!b->py)
        printf("(%s could not be run: no frameworks checked)\n", b->python);
    else if (!kolorun_probe_line(b->probe, "kolo", kver, sizeof kver))
        printf("(%s cannot import the kolo package: put bindings/python on "
               "PYTHONPATH, or install kolo: pip install ., make install)\n",
               b->python);
}

__attribute__((noreturn)) void kolorun_check_build(void)
{
    kolorun_build_t b = {.libpath = ""};
    void *h = kolorun_libkolo(b.libpath, sizeof b.libpath, b.why, sizeof b.why);
    b.built = h ? (kolorun_built_fn)dlsym(h, "kolo_built") : NULL;
    b.python = kolorun_python();
    kolorun_probe_python(&b);
    kolorun_backends(&b);
    kolorun_gpu_visible(b.gpu, sizeof b.gpu);

    printf("kolo v%s:\n\n", PACKAGE_VERSION);
    kolorun_print_frameworks(&b);
    kolorun_print_backends(&b);
    kolorun_print_defaults(&b);
    kolorun_print_notes(&b);
    fflush(stdout);
    exit(0);
}
