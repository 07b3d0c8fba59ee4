/*
 * devmem.c - device memory through a dlopen'ed CUDA runtime (see devmem.h).
 *
 * The CUDA backend wants device pointers; the tool is plain C and must build
 * without CUDA, so it looks up the few runtime calls it needs at run time.
 * Which runtime is what the build knows: configure finds the soname of the
 * libcudart that the CUDA backend links, and the folder it was found in
 * (BEAM_CUDART_SONAME, BEAM_CUDART_DIR, m4/beam_cuda.m4). The runtime's
 * primary context is shared with the backend library, so pointers from
 * here are valid there.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devmem.h"
#include "util.h"

typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);
typedef int (*memcpy_fn)(void *, const void *, size_t, int);
typedef int (*sync_fn)(void);
typedef const char *(*errstr_fn)(int);
typedef int (*stream_create_fn)(void **, unsigned);
typedef int (*stream_fn)(void *);
typedef int (*memcpy_async_fn)(void *, const void *, size_t, int, void *);

enum { H2D = 1, D2H = 2 }; /* cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost */

static struct {
    void *lib;
    malloc_fn cmalloc;
    free_fn cfree;
    memcpy_fn cmemcpy;
    sync_fn csync;
    errstr_fn cerr;
    stream_create_fn cscreate;
    stream_fn cssync, csdestroy;
    memcpy_async_fn cmemcpy_async;
    char last[256];
} g;

static void note(const char *what, int rc)
{
    snprintf(g.last, sizeof g.last, "%s: %s (%d)", what, g.cerr ? g.cerr(rc) : "?", rc);
}

int dev_open(char *msg, size_t n)
{
#ifndef BEAM_CUDART_SONAME
    /* configured without CUDA, or configure found no soname (it warned) */
    snprintf(msg, n, "no CUDA: this build knows no CUDA runtime (configured without CUDA, or without a "
                     "soname of libcudart), so no device memory");
    return -1;
#else
    static const char soname[] = BEAM_CUDART_SONAME;
    static const char path[] = BEAM_CUDART_DIR "/" BEAM_CUDART_SONAME;
    if (g.lib) return 0;
    /* The copy the CUDA backend already loaded (it links this soname): one
     * runtime in the process. Else the one the backend would load: the
     * loader's search path first (LD_LIBRARY_PATH comes before the
     * backend's run path), then the folder configure found it in (that run
     * path). */
    g.lib = dlopen(soname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
    if (!g.lib) g.lib = dlopen(soname, RTLD_NOW | RTLD_GLOBAL);
    if (!g.lib) g.lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!g.lib) {
        snprintf(msg, n, "cannot load the CUDA runtime %s that the CUDA backend links (nor %s): %s", soname, path,
                 dlerror());
        return -1;
    }
    /* Casts through void* keep -Wpedantic quiet about object/function pointers. */
    *(void **)&g.cmalloc = dlsym(g.lib, "cudaMalloc");
    *(void **)&g.cfree = dlsym(g.lib, "cudaFree");
    *(void **)&g.cmemcpy = dlsym(g.lib, "cudaMemcpy");
    *(void **)&g.csync = dlsym(g.lib, "cudaDeviceSynchronize");
    *(void **)&g.cerr = dlsym(g.lib, "cudaGetErrorString");
    *(void **)&g.cscreate = dlsym(g.lib, "cudaStreamCreateWithFlags");
    *(void **)&g.cssync = dlsym(g.lib, "cudaStreamSynchronize");
    *(void **)&g.csdestroy = dlsym(g.lib, "cudaStreamDestroy");
    *(void **)&g.cmemcpy_async = dlsym(g.lib, "cudaMemcpyAsync");
    if (!g.cmalloc || !g.cfree || !g.cmemcpy || !g.csync || !g.cerr || !g.cscreate || !g.cssync || !g.csdestroy ||
        !g.cmemcpy_async) {
        snprintf(msg, n, "the CUDA runtime %s lacks cudaMalloc/cudaMemcpy/...", soname);
        dlclose(g.lib);
        memset(&g, 0, sizeof g);
        return -1;
    }
    return 0;
#endif
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

const void *dev_place(const void *src, size_t bytes, size_t off, int dev, void **block)
{
    unsigned char *p;
    *block = NULL;
    if (!src || (!dev && !off)) return src;
    if (!dev) {
        p = (unsigned char *)hu_alloc(bytes ? bytes : 1, off);
        memcpy(p, src, bytes);
        *block = p;
        return p;
    }
    p = (unsigned char *)dev_alloc(bytes + 16);
    if (!p) return NULL;
    *block = p;
    if (dev_upload(p + off, src, bytes)) return NULL;
    return p + off;
}

void dev_unplace(void *block, int dev)
{
    if (dev)
        dev_free(block);
    else
        hu_free(block);
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

void *dev_stream_create(void)
{
    void *s = NULL;
    int rc = g.cscreate(&s, 1u); /* cudaStreamNonBlocking */
    if (rc) note("cudaStreamCreateWithFlags", rc);
    return rc ? NULL : s;
}

int dev_stream_sync(void *stream)
{
    int rc = g.cssync(stream);
    if (rc) note("cudaStreamSynchronize", rc);
    return rc ? -1 : 0;
}

void dev_stream_destroy(void *stream)
{
    if (stream && g.csdestroy) g.csdestroy(stream);
}

int dev_upload_on(void *dst, const void *src, size_t bytes, void *stream)
{
    int rc = bytes ? g.cmemcpy_async(dst, src, bytes, H2D, stream) : 0;
    if (rc) note("cudaMemcpyAsync to device", rc);
    return rc ? -1 : 0;
}

void dev_shared_gpu_env(void)
{
    /* 8 ranks use up to 24 streams (tests/gather_parts.c's concurrent part:
     * two more per rank) */
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
}
