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

__attribute__((noreturn)) void kolorun_check_build(void)
{
    char libpath[4200] = "", why[512], probe[4096], tver[128], nver[128], kver[128];
    void *h = kolorun_libkolo(libpath, sizeof libpath, why, sizeof why);
    kolorun_built_fn built = h ? (kolorun_built_fn)dlsym(h, "kolo_built") : NULL;
    const char *python = getenv("KOLO_PYTHON");
#ifdef KOLO_CONFIGURED_PYTHON
    if ((!python || !*python) && strcmp(KOLO_CONFIGURED_PYTHON, ":") != 0 &&
        KOLO_CONFIGURED_PYTHON[0] != '\0')
        python = KOLO_CONFIGURED_PYTHON;
#endif
    char *pyargv[] = {
        (char *)(python && *python ? python : "python3"), "-c",
        "import importlib\n"
        "for m in ('torch', 'numpy', 'kolo'):\n"
        "    try:\n"
        "        v = getattr(importlib.import_module(m), '__version__', '?')\n"
        "        print(m, v)\n"
        "    except Exception as e:\n"
        "        print(m + '-', type(e).__name__)\n",
        NULL};
    int py = kolorun_capture(pyargv, probe, sizeof probe) == 0;
    int have_gloo, have_mpi, have_shm, have_cuda, nccl;
    char gpu[256];

    if (built) {
        have_gloo = built("gloo");
        have_mpi = built("mpi");
        have_shm = built("shm");
        have_cuda = built("cuda");
        nccl = built("nccl");
    } else {
        have_gloo = kolorun_configured("gloo");
        have_mpi = kolorun_configured("mpi");
        have_shm = kolorun_configured("shm");
        have_cuda = kolorun_configured("cuda");
        nccl = kolorun_configured("nccl");
    }
    kolorun_gpu_visible(gpu, sizeof gpu);

    printf("kolo v%s:\n\n", PACKAGE_VERSION);
    printf("Available Frameworks:\n");
    const char *torch = py ? kolorun_probe_line(probe, "torch", tver, sizeof tver) : NULL;
    const char *numpy = py ? kolorun_probe_line(probe, "numpy", nver, sizeof nver) : NULL;
    printf("    [%c] PyTorch%s%s\n", torch ? 'X' : ' ', torch ? " " : "",
           torch ? torch : "");
    printf("    [%c] NumPy%s%s\n", numpy ? 'X' : ' ', numpy ? " " : "",
           numpy ? numpy : "");
    printf("\nAvailable Controllers:\n");
    printf("    [%c] shm\n", have_shm ? 'X' : ' ');
    printf("    [%c] Gloo\n", have_gloo ? 'X' : ' ');
    printf("    [%c] MPI\n", have_mpi ? 'X' : ' ');
    printf("\nAvailable Tensor Operations:\n");
    if (nccl > 1)
        printf("    [X] NCCL %d.%d.%d\n", nccl >= 10000 ? nccl / 10000 : nccl / 1000,
               nccl >= 10000 ? nccl % 10000 / 100 : nccl % 1000 / 100, nccl % 100);
    else
        printf("    [%c] NCCL\n", nccl ? 'X' : ' ');
    printf("    [%c] shm\n", have_shm ? 'X' : ' ');
    printf("    [%c] Gloo\n", have_gloo ? 'X' : ' ');
    printf("    [%c] MPI\n", have_mpi ? 'X' : ' ');
    printf("    [%c] CUDA\n", have_cuda ? 'X' : ' ');
    /* What a job uses when KOLO_CONTROLLER and KOLO_CPU_OPERATIONS are
     * not set (ops/registry.c chooses; --gloo sets both to gloo). */
    const char *net = have_gloo ? "Gloo" : have_mpi ? "MPI (under mpirun)" : "none";
    printf("\nWhat negotiates and moves host tensors (KOLO_CONTROLLER,\n"
           "KOLO_CPU_OPERATIONS unset):\n");
    printf("    kolorun -np N, one host:     %s\n", have_shm ? "shm" : net);
    printf("    kolorun across hosts:        %s\n", net);
    printf("    kolorun --gloo:              %s\n", have_gloo ? "Gloo" : "(no Gloo)");
    printf("    kolorun --mpi, mpirun:       %s\n", have_mpi ? "MPI" : "(no MPI)");
    printf("\nGPU visible now: %s\n", gpu);
    if (built)
        printf("(libkolo: %s)\n", libpath);
    else
        printf("(libkolo could not be loaded: %s; this is what ./configure "
               "found)\n", why);
    if (!py)
        printf("(%s could not be run: no frameworks checked)\n", pyargv[0]);
    else if (!kolorun_probe_line(probe, "kolo", kver, sizeof kver))
        printf("(%s cannot import the kolo package: put bindings/python on "
               "PYTHONPATH, or install kolo: pip install ., make install)\n",
               pyargv[0]);
    fflush(stdout);
    exit(0);
}
