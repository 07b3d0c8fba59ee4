/*
 * devmem.c - device memory through a dlopen'ed CUDA runtime (see devmem.h).
 *
 * The CUDA backend wants device pointers; the tool is plain C and must build
 * without CUDA, so it looks up the five runtime calls it needs at run time.
 * The runtime's primary context is shared with the backend library, so
 * pointers from here are valid there.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "devmem.h"

typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);
typedef int (*memcpy_fn)(void *, const void *, size_t, int);
typedef int (*sync_fn)(void);
typedef const char *(*errstr_fn)(int);

enum { H2D = 1, D2H = 2 }; /* cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost */

static struct {
    void *lib;
    malloc_fn cmalloc;
    free_fn cfree;
    memcpy_fn cmemcpy;
    sync_fn csync;
    errstr_fn cerr;
    char last[256];
} g;

static void note(const char *what, int rc)
{
    snprintf(g.last, sizeof g.last, "%s: %s (%d)", what, g.cerr ? g.cerr(rc) : "?", rc);
}

int dev_open(char *msg, size_t n)
{
    /* The soname first: when the backend links the runtime dynamically this
     * finds the copy already loaded. Then the usual toolkit location. */
    static const char *names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so",
                                  "/usr/local/cuda/lib64/libcudart.so.13",
                                  "/usr/local/cuda/lib64/libcudart.so.12",
                                  "/usr/local/cuda/lib64/libcudart.so"};
    size_t i;
    if (g.lib) return 0;
    for (i = 0; i < sizeof names / sizeof names[0] && !g.lib; i++)
        g.lib = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    if (!g.lib) {
        snprintf(msg, n, "cannot load the CUDA runtime (libcudart.so): %s", dlerror());
        return -1;
    }
    /* Casts through void* keep -Wpedantic quiet about object/function pointers. */
    *(void **)&g.cmalloc = dlsym(g.lib, "cudaMalloc");
    *(void **)&g.cfree = dlsym(g.lib, "cudaFree");
    *(void **)&g.cmemcpy = dlsym(g.lib, "cudaMemcpy");
    *(void **)&g.csync = dlsym(g.lib, "cudaDeviceSynchronize");
    *(void **)&g.cerr = dlsym(g.lib, "cudaGetErrorString");
    if (!g.cmalloc || !g.cfree || !g.cmemcpy || !g.csync || !g.cerr) {
        snprintf(msg, n, "the CUDA runtime lacks cudaMalloc/cudaMemcpy/...");
        dlclose(g.lib);
        memset(&g, 0, sizeof g);
        return -1;
    }
    return 0;
}

void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    int rc;
    if (bytes < 256) bytes = 256;
    rc = g.cmalloc(&p, bytes);
    if (rc) {
        note("cudaMalloc", rc);
        return NULL;
    }
    return p;
}

void dev_free(void *p)
{
    if (p && g.cfree) g.cfree(p);
}

int dev_upload(void *dst, const void *src, size_t bytes)
{
    int rc = bytes ? g.cmemcpy(dst, src, bytes, H2D) : 0;
    if (rc) note("cudaMemcpy to device", rc);
    return rc ? -1 : 0;
}

int dev_download(void *dst, const void *src, size_t bytes)
{
    int rc = bytes ? g.cmemcpy(dst, src, bytes, D2H) : 0;
    if (rc) note("cudaMemcpy to host", rc);
    return rc ? -1 : 0;
}

int dev_sync(void)
{
    int rc = g.csync();
    if (rc) note("cudaDeviceSynchronize", rc);
    return rc ? -1 : 0;
}

const char *dev_last_error(void) { return g.last; }
