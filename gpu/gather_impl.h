/*
 * gather_impl.h - the state of an NCCL gather workspace and the launches
 * shared by gpu/gather_*.cu (internal, C++).
 *
 * Peer-visible region (one cudaMalloc per rank, exported with a CUDA IPC
 * handle and mapped by every peer of the same host):
 *
 *   flags [2][BM_TP_MAX_RANKS][BM_TP_MAX_BLOCKS] u64  flags[p][s][b]: the
 *         last epoch of parity p in which block b of rank s finished
 *         pushing its rows here (a waiter wants exactly its epoch)
 *   errf  [BM_TP_MAX_RANKS] u64    the last epoch in which rank s rejected
 *         its arguments (then it pushed nothing)
 *   arr   [BM_TP_MAX_RANKS] u64    the epoch rank s last started (so it
 *         finished the one before: its reads of the parity before are done)
 *   sig   [2][BM_TP_MAX_RANKS] u64  sig[p][s]: (low 32 bits of the epoch
 *         << 32) | the signature of rank s's arguments in that epoch of
 *         parity p (bm_tp_signature), so that ranks that disagree on a call
 *         fail it instead of mixing rows of different calls
 *   ll    [2][ll_rows][hidden/2] u64  ONESHOT decode rows as LL words
 *         (epoch tag << 32 | two BF16), no flags needed
 *   data  [2 parities][2 arrays][max_tokens][hidden] BF16: rows pushed by
 *         the peers, at their global row index. ONESHOT uses array 0 (the
 *         finalized rows); TWOSHOT arrays 0 and 1 (hidden, normalized).
 *         The all-reduce (allreduce_fused.cu): array 0 holds the rank's
 *         own partials, which its peers read, and TWOSHOT's pushes over
 *         them; UNFUSED of several chunks keeps its sums in parity 0's.
 *
 * Epochs: every fused call is one epoch E = previous + 1, read from device
 * memory that the kernel itself advances, so CUDA graph replays advance it
 * too and no host code runs per call. The epoch is kept in
 * BM_TP_MAX_BLOCKS equal copies: block b reads copy b at its start and at
 * its end writes E into copies b, b + G, b + 2G, ... (G blocks), so every
 * copy is advanced by every call whatever its grid, no block writes a copy
 * another block of the same call reads, and no atomic is needed. Epoch E uses
 * parity E & 1 of the data, LL and flag arrays. Each kernel first stores E
 * into arr[r] of every peer (it started E, so its epoch E-1 kernel, the
 * last reader of parity (E+1) & 1, has completed: calls on one workspace are
 * stream-ordered), then waits until every peer's arr >= E-1 before pushing
 * into parity E & 1, which that peer last read in epoch E-2. Normally that
 * holds at once: it only keeps a rank that receives nothing (T < R) from
 * running two calls ahead. So no flag is ever reset and no row is
 * overwritten while a peer reads it. Waiters want exactly their epoch in a
 * flag or LL tag: a rank out of step ends in a timeout, never in a wrong
 * row. The epoch is 64 bits (it cannot wrap); LL tags carry its low 32
 * bits, and every 2^30 epochs two calls run without LL words and zero the
 * LL rows of their parity, so no tag older than 2^31 epochs survives to be
 * mistaken for a current one (gather_fused.cu).
 *
 * Concurrency: every kernel that advances the epoch first claims the
 * workspace's state for its grid (the claim word holds the grid's
 * %gridid + 1, released by the grid's last block). A kernel that finds
 * another grid's claim (two calls on one workspace not ordered on one
 * stream) computes nothing, records BM_TP_CONCURRENT, and the workspace is
 * dead: overlapping calls are refused, never computed.
 *
 * Ranks: the workspace is made either over an NCCL communicator (one rank
 * per process and device) or over an in-process group (gather_group.cu:
 * each rank a thread, on its thread's device; several ranks may share one
 * device, so that every world size runs on one GPU). Both run the same
 * kernels over the same flags; only UNFUSED's all-gather differs (NCCL, or
 * a kernel over the peers' buffers).
 */
#ifndef BEAMMOE_GPU_GATHER_IMPL_H
#define BEAMMOE_GPU_GATHER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "gather.h"
#include "params.cuh"
#include "tp_shape.h"

#define BM_TP_MAX_RANKS 8
#define BM_TP_MAX_BLOCKS 1024
/* ONESHOT uses LL words (data and epoch tag in one 8-byte store) while
 * L = ceil(T / R) <= this; the LL buffers hold R * this rows. */
#define BM_TP_LL_MAX_L 64

/* Launch shapes of the fused kernel: (index, threads per block, chunks per
 * thread, blocks per row (a cluster)). Decode shapes first (J = 1, the row
 * spread over CS blocks so that NT * CS covers it), then prefill. */
#define BM_TP_SHAPES(X)                                                        \
    X(0, 32, 1, 1) X(1, 64, 1, 1) X(2, 128, 1, 1) X(3, 256, 1, 1)              \
    X(4, 512, 1, 1) X(5, 1024, 1, 1)                                           \
    X(6, 64, 1, 2) X(7, 64, 1, 4) X(8, 64, 1, 8) X(9, 128, 1, 2)               \
    X(10, 128, 1, 4) X(11, 128, 1, 8) X(12, 256, 1, 2) X(13, 256, 1, 4)        \
    X(14, 512, 1, 2)                                                           \
    X(15, 128, 2, 1) X(16, 256, 2, 1) X(17, 512, 2, 1)
#define BM_TP_NSHAPES 18
/* launch caps: gpu/tp_shape.h says which is which */
#define BM_TP_NCAPS (4 * BM_TP_NSHAPES + 1)
#define BM_TP_QCAP(i) bm_tp_cap_index(BM_TP_NSHAPES, (i), 1, 0)
#define BM_TP_ACAP(i, q) bm_tp_cap_index(BM_TP_NSHAPES, (i), (q), 1)

/* Failure record in host-mapped memory, written by a kernel, read by the
 * host at the start of the next call (a plain load, no synchronization). */
enum {
    BM_TP_OK = 0,
    BM_TP_TIMEOUT = 1,       /* waited longer than timeout_ms for peer */
    BM_TP_PEER_REJECTED = 2, /* peer rejected its arguments */
    BM_TP_MISMATCH = 3,      /* peer passed arguments that differ from ours */
    BM_TP_CONCURRENT = 4,    /* two calls on this workspace overlapped */
    BM_TP_PEER_FAILED = 5,   /* peer gave the call up (it found a failure) */
    BM_TP_NCCL_TIMEOUT = 6   /* UNFUSED over NCCL: the all-gather outlasted timeout_ms */
};
struct bm_tp_err {
    volatile uint32_t code;
    volatile int32_t peer;
    volatile unsigned long long epoch;
    /* NCCL UNFUSED: the all-gathers begun and ended, written by the record
     * and check kernels around each one, read by the watchdog
     * (gather_watch.cu) */
    volatile unsigned long long ag_begun, ag_ended;
};



/* Words of a rank's own device state after the BM_TP_MAX_BLOCKS epoch
 * copies: the claim of the grid that runs (0: none), the count of its
 * blocks that finished (in its low 32 bits, bm_tp_finish_send), and the
 * dead word (nonzero once a failure was recorded: later kernels then wait
 * for nothing, bm_tp_claim). */
enum {
    BM_TP_CLAIM = BM_TP_MAX_BLOCKS,
    BM_TP_DONE = BM_TP_MAX_BLOCKS + 1,
    BM_TP_DEAD = BM_TP_MAX_BLOCKS + 2,
    BM_TP_AG = BM_TP_MAX_BLOCKS + 3, /* NCCL UNFUSED: all-gathers begun */
    BM_TP_STATE_WORDS = BM_TP_MAX_BLOCKS + 4
};

struct bm_tp_watch;

struct bm_tp_ws {
    ncclComm_t comm;          /* NULL for an in-process group */
    /* NCCL: the workspace's own communicator, split from comm at creation
     * and non-blocking, so that the library can bound every wait on it
     * and abort it (gather_watch.cu); NULL once aborted */
    ncclComm_t own;
    struct bm_tp_watch *watch; /* its watchdog (NCCL, R > 1) */
    beam_cpu_group *group;    /* an in-process group (gather_group.cu); NULL for NCCL */
    int device;
    int rank, nranks;
    int peers; /* 1: every rank's region is mapped (fused strategies work) */
    int shared; /* 1: another rank runs on this device (an in-process group) */
    int64_t max_tokens;
    int hidden;

    char *base;                    /* own peer-visible region */
    char *peer[BM_TP_MAX_RANKS];   /* every rank's region, mapped here */
    uint16_t *peer_ag[BM_TP_MAX_RANKS]; /* in-process group: every rank's ag */
    size_t flags_off, errf_off, arr_off, sig_off, fail_off, ll_off, data_off, slot_bytes, region_bytes;
    int64_t ll_rows;

    unsigned long long *epoch;     /* device: [BM_TP_STATE_WORDS]: the epoch copies, claim, done, dead */
    uint16_t *ag;                  /* UNFUSED all-gather rows */
    size_t ag_rows;
    uint32_t *rec;                 /* NCCL UNFUSED: [2 * BM_TP_MAX_RANKS] records (status, signature) */
    bm_tp_err *err_h, *err_d;      /* host-mapped failure record */
    /* blocks per launch, agreed by all ranks (BM_TP_NCAPS); divided among
     * the ranks that share a device, so that every rank's kernel is
     * resident at once */
    int gcap[BM_TP_NCAPS];
    /* the fewest multiprocessors of any rank's device, agreed at creation:
     * the decode shapes' wave (gpu/tp_shape.h) */
    int sms;
    cudaStream_t side;             /* create/destroy collectives only */
    uint32_t timeout_ms;
};

/* Arguments of one fused launch (by value): the row stages' block
 * (params.cuh; rows: the call's tokens T, out: hidden_out, residual [T, H]
 * may equal out, experts: this rank's owned rows [L, K, H]) and the
 * gather's own. */
struct bm_tp_params : bm_row_params {
    int64_t L;
    int rank, nranks;
    char *peer[BM_TP_MAX_RANKS];
    size_t flags_off, errf_off, arr_off, ll_off, data_off, slot_bytes;
    int64_t ll_rows;
    int ll; /* ONESHOT through LL words */
    int early; /* trigger the next kernel's launch at the start (no peer on this device) */
    unsigned long long *epoch;
    bm_tp_err *err;
    unsigned long long timeout_ns;
    uint32_t sig; /* bm_tp_signature of this call */
    int twoshot;  /* the all-reduce's strategy (the gather's is a template argument) */
    size_t sig_off, fail_off;
    uint16_t *ag;                        /* all-gather kernel: own rows */
    uint16_t *peer_ag[BM_TP_MAX_RANKS];  /* all-gather kernel: every rank's ag */
};

/* The signature of a call's arguments: a hash of what every rank must pass
 * alike (lib/agree.h; strategy_word: bm_agree_coll, the strategy and the
 * collective). Never 0. */
uint32_t bm_tp_signature(const bm_args *a, int strategy_word);

/* gather_fused.cu */
/* qkind: the quantized output's kind (BEAM_QUANT_FP8_*, 0 none): a
 * token's scale takes a shape of one block per row; sms: the workspace's
 * (bm_tp_ws.sms) */
int bm_tp_shape_index(int64_t L, int hidden, int qkind, int sms);
int bm_tp_device_sms(void);         /* the current device's multiprocessors */
cudaError_t bm_tp_launch_fused(const bm_tp_ws *w, const bm_args *a, int twoshot, uint32_t sig,
                               cudaStream_t stream);
/* A rank whose arguments failed: mark its flags for this epoch as "rejected"
 * at every peer so that they stop waiting and report it. */
cudaError_t bm_tp_launch_reject(const bm_tp_ws *w, cudaStream_t stream);
/* In-process group, UNFUSED: push this rank's L finalized rows (in w->ag)
 * into every peer's ag and wait for theirs, over the flags. */
cudaError_t bm_tp_launch_allgather(const bm_tp_ws *w, int64_t T, uint32_t sig, cudaStream_t stream);
/* Every rank's occupancy cap of every fused shape, divided by share. */
void bm_tp_caps(int share, int32_t *caps); /* [BM_TP_NCAPS] */
/* Load every kernel a gather call can launch (lazy module loading). */
cudaError_t bm_tp_preload(void);

/* The gather's own fields of a fused launch's parameters, from the
 * workspace (gather_fused.cu). */
void bm_tp_fill(const bm_tp_ws *w, bm_tp_params *p);

/* allreduce_fused.cu: the all-reduce's ONESHOT / TWOSHOT kernel (a: the
 * checked call, a->x the dense form's partial or a->experts the MoE
 * form's slots; a->pre the norm of the sum); the ordered sum of UNFUSED
 * over nranks blocks `stride` values apart into dst (values: a multiple
 * of 8); the kernels' occupancy of a shape (q: with a quantized output),
 * which the caps take; their preload. */
cudaError_t bm_ar_launch_fused(const bm_tp_ws *w, const bm_args *a, int twoshot, uint32_t sig,
                               cudaStream_t stream);
cudaError_t bm_ar_launch_sum(const uint16_t *blocks, size_t stride, int nranks, uint16_t *dst, size_t values,
                             cudaStream_t stream);
int bm_ar_occupancy(int shape, int q);
cudaError_t bm_ar_preload(void);

/* gather_unfused.cu: finalize, all-gather (NCCL or the kernel above),
 * norm_residual_norm. local_status != BEAM_OK: this rank only tells its
 * peers (it joins the all-gather with a "rejected" record). */
beam_status bm_tp_unfused(const char *fn, bm_tp_ws *w, const bm_args *a, uint32_t sig,
                          beam_status local_status);
/* The all-reduce's UNFUSED, as bm_tp_unfused: partials, all-gather, the
 * ordered sum, norm_residual_norm (gather_unfused.cu). */
beam_status bm_ar_unfused(const char *fn, bm_tp_ws *w, const bm_args *a, uint32_t sig,
                          beam_status local_status);
/* NCCL UNFUSED records (gather_fused.cu): write this rank's, check all
 * (count_only: only count the all-gather ended, for the watchdog). */
cudaError_t bm_tp_launch_record(const bm_tp_ws *w, uint32_t status, uint32_t sig, cudaStream_t stream);
cudaError_t bm_tp_launch_check(const bm_tp_ws *w, uint32_t sig, int count_only, cudaStream_t stream);

/* What every rank must pass alike at creation: the workspace's size and
 * configuration (gather_ws.cu; the NCCL exchange and in-process groups). */
struct bm_tp_shape {
    int64_t max_tokens, oneshot, twoshot;
    int32_t hidden, timeout_ms;
};
bm_tp_shape bm_tp_shape_of(const bm_ws *ws);
/* BEAM_OK, or invalid argument naming rank s and both sides' values. */
beam_status bm_tp_same_shape(const char *fn, int s, const bm_tp_shape *theirs, const bm_tp_shape *mine);

/* gather_ws.cu: the layout of the peer-visible region and the allocations
 * every workspace has (any transport); the release of what they hold. */
const char *bm_tp_alloc(bm_tp_ws *w, const bm_ws *ws, int R);
void bm_tp_release(bm_tp_ws *w);

/* gather_group.cu: an in-process group's destruction (collective); st: the
 * status to return when it succeeds. */
beam_status bm_tp_group_destroy(bm_tp_ws *w, beam_status st);

/* gather_watch.cu: the workspace's own communicator and its watchdog.
 * bm_tp_own_split: split parent into *own (non-blocking), collective, with
 * the wait for the peers bounded where parent allows it (a blocking parent
 * waits inside NCCL). bm_tp_own_settle: after an operation on w->own that
 * returned r, wait until NCCL has taken it and, with a stream, until the
 * stream is done, at most until deadline_ns (bm_tp_now_ns clock); past it,
 * or on an NCCL error, abort w->own (recording why) and return the error.
 * bm_tp_own_abort: record code (if none is yet) and abort w->own, once.
 * bm_tp_own_enter/leave: around a use of w->own while the watchdog runs;
 * enter returns 0 (and holds nothing) when w->own was aborted.
 * bm_tp_watch_start/stop: the watchdog that aborts w->own when an UNFUSED
 * all-gather has run longer than timeout_ms (the peers never came).
 * bm_tp_own_close: finalize and destroy w->own, bounded; abort if that
 * fails. */
unsigned long long bm_tp_now_ns(void);
ncclResult_t bm_tp_own_split(ncclComm_t parent, int rank, ncclComm_t *own, unsigned long long deadline_ns);
ncclResult_t bm_tp_own_settle(bm_tp_ws *w, ncclResult_t r, cudaStream_t stream, unsigned long long deadline_ns,
                              int stream_too);
void bm_tp_own_abort(bm_tp_ws *w, uint32_t code);
int bm_tp_own_enter(bm_tp_ws *w);
void bm_tp_own_leave(bm_tp_ws *w);
int bm_tp_watch_start(bm_tp_ws *w);
void bm_tp_watch_stop(bm_tp_ws *w);
void bm_tp_own_close(bm_tp_ws *w);

/* gather_ws.cu: the failure record as a status + message (BEAM_OK if none). */
beam_status bm_tp_check_failed(const char *fn, const bm_tp_ws *w);

#endif
