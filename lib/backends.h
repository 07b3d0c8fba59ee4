/*
 * backends.h - the list of backends (lib/backends.def) for C code: the
 * enum of their ids, their names, and a name's id (internal).
 *
 * Read by the dispatcher (which library to load, the order "auto" tries),
 * by lib/api.c (the names a backend library refuses as another backend's)
 * and by the tool (the backends `beammoe audit` and `run` know).
 */
#ifndef BEAMMOE_LIB_BACKENDS_H
#define BEAMMOE_LIB_BACKENDS_H

#include <string.h>

#define BM_BACKEND(name, id, device_memory) id,
enum bm_backend_id {
#include "backends.def"
    BM_NBACKENDS
};
#undef BM_BACKEND

/* The name of backend b. */
static inline const char *bm_backend_name(int b)
{
#define BM_BACKEND(name, id, device_memory) #name,
    static const char *const names[BM_NBACKENDS] = {
#include "backends.def"
    };
#undef BM_BACKEND
    return names[b];
}

/* Whether backend b's calls take device memory (1) or host memory (0). */
static inline int bm_backend_device_memory(int b)
{
#define BM_BACKEND(name, id, device_memory) device_memory,
    static const int dev[BM_NBACKENDS] = {
#include "backends.def"
    };
#undef BM_BACKEND
    return dev[b];
}

/* The names for messages, joined by ", ": quoted ("cpu", "cuda") or not
 * (cpu, cuda). */
static inline const char *bm_backend_choices(int quoted)
{
#define BM_BACKEND(name, id, device_memory) ", \"" #name "\""
    static const char q[] = ""
#include "backends.def"
        ;
#undef BM_BACKEND
#define BM_BACKEND(name, id, device_memory) ", " #name
    static const char plain[] = ""
#include "backends.def"
        ;
#undef BM_BACKEND
    return (quoted ? q : plain) + 2;
}

/* The id of the backend called `name`, or -1 ("auto" is no backend). */
static inline int bm_backend_find(const char *name)
{
    int b;
    for (b = 0; b < BM_NBACKENDS; b++)
        if (strcmp(name, bm_backend_name(b)) == 0) return b;
    return -1;
}

#endif
