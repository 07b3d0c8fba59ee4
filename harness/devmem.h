/*
 * devmem.h - device memory for the tool, through a run-time loaded CUDA
 * runtime (dlopen of the libcudart that the CUDA backend links, as
 * configure found it), so the tool builds and runs on hosts without CUDA
 * and needs no CUDA headers or link flags.
 */
#ifndef BEAMMOE_TOOLS_DEVMEM_H
#define BEAMMOE_TOOLS_DEVMEM_H

#include <stddef.h>

/* 0 when the CUDA runtime is loaded (idempotent); else -1 with a message
 * (a build without CUDA: always, saying so). */
int dev_open(char *msg, size_t n);
void *dev_alloc(size_t bytes);                           /* NULL on failure */
void dev_free(void *p);
int dev_upload(void *dst, const void *src, size_t bytes); /* 0 on success */
int dev_download(void *dst, const void *src, size_t bytes);
int dev_sync(void);
/* A stream that does not wait for the legacy default stream (each rank of
 * an in-process group its own), its synchronization, its end. */
void *dev_stream_create(void); /* NULL on failure */
/* dev_upload ordered on stream (a pageable cudaMemcpy may return before its
 * copy lands, and a non-blocking stream does not wait for it) */
int dev_upload_on(void *dst, const void *src, size_t bytes, void *stream);
int dev_stream_sync(void *stream);
void dev_stream_destroy(void *stream);
const char *dev_last_error(void);

#endif
