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
/* src where a backend is to read it: a copy `off` bytes past a 16-byte
 * boundary, in device memory with dev, else on the host; on the host with
 * off 0, src itself. *block: what dev_unplace(*block, dev) frees (NULL for
 * src itself). NULL on failure, with dev_last_error(); NULL src: NULL. */
const void *dev_place(const void *src, size_t bytes, size_t off, int dev, void **block);
void dev_unplace(void *block, int dev);
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
/* For a process that runs several ranks' streams on one GPU, before its
 * first CUDA call: one hardware work queue per stream (the runtime maps
 * streams onto CUDA_DEVICE_MAX_CONNECTIONS queues, 8 by default; two ranks'
 * kernels on one queue run one after the other, and a rank's kernel that
 * waits for a peer's kernel queued behind it waits until the timeout), and
 * every kernel loaded when the context is made (CUDA's lazy load at a first
 * launch waits for the device's running kernels, a waiting peer's among
 * them). Values already in the environment are kept. */
void dev_shared_gpu_env(void);

#endif
