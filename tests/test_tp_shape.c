/*
 * test_tp_shape.c - the gather's decode cluster size (gpu/tp_shape.h) from
 * the workspace's multiprocessor count, and the launch caps' index and
 * its inverse (an all-reduce cap once read another shape's: its grid
 * then outgrew the device). The cluster size by hand: the grid of a decode
 * launch (rows times blocks per row) stays within one wave of the device
 * the workspace names, an H100 PCIe (114), an H20 (78), an H200 (132) or a
 * B200 (148), never of a fixed one. Plain C: runs on any host.
 */
#include <stdint.h>
#include <stdio.h>

#include <CUnit/Basic.h>

#include "suite.h"
#include "tp_shape.h"

static void test_by_hand(void)
{
    static const struct {
        int64_t rows;
        int n2, token, sms, want;
    } v[] = {
        /* H = 7168 (n2 = 1024): 8 blocks a row while rows * 8 fits */
        {1, 1024, 0, 132, 8},  {16, 1024, 0, 132, 8}, {17, 1024, 0, 132, 4}, {33, 1024, 0, 132, 4}, {34, 1024, 0, 132, 2},
        {66, 1024, 0, 132, 2}, {67, 1024, 0, 132, 1}, {14, 1024, 0, 114, 8}, {15, 1024, 0, 114, 4},
        {9, 1024, 0, 78, 8},   {10, 1024, 0, 78, 4},  {19, 1024, 0, 78, 4},  {20, 1024, 0, 78, 2},
        {18, 1024, 0, 148, 8}, {19, 1024, 0, 148, 4},
        /* at least 64 threads a block: n2 = 256 takes 4 at most, 128 two */
        {1, 256, 0, 132, 4},   {1, 128, 0, 132, 2},   {1, 64, 0, 132, 1},   {1, 32, 0, 132, 1},
        /* a scale per token: one block a row */
        {1, 1024, 1, 132, 1},  {1, 1024, 1, 148, 1},
        /* a device smaller than one row's cluster */
        {1, 1024, 0, 4, 4},    {1, 1024, 0, 1, 1}};
    size_t i;
    for (i = 0; i < sizeof v / sizeof v[0]; i++) {
        const int got = bm_tp_cluster_size(v[i].rows, v[i].n2, v[i].token, v[i].sms);
        if (got != v[i].want)
            fprintf(stderr, "rows=%lld n2=%d token=%d sms=%d: %d blocks a row, want %d\n", (long long)v[i].rows,
                    v[i].n2, v[i].token, v[i].sms, got, v[i].want);
        CU_ASSERT_EQUAL(got, v[i].want);
    }
}

/* Every answer keeps the grid within the wave where a smaller cluster can. */
static void test_wave(void)
{
    static const int sms[] = {1, 16, 78, 114, 132, 148, 1000};
    int s, n2, token;
    int64_t rows;
    for (s = 0; s < (int)(sizeof sms / sizeof sms[0]); s++)
        for (n2 = 32; n2 <= 1024; n2 *= 2)
            for (token = 0; token < 2; token++)
                for (rows = 1; rows <= 200; rows++) {
                    const int cs = bm_tp_cluster_size(rows, n2, token, sms[s]);
                    CU_ASSERT(cs == 1 || cs == 2 || cs == 4 || cs == 8);
                    CU_ASSERT(cs == 1 || (rows * cs <= sms[s] && n2 / cs >= 64 && !token));
                    if (cs < 8 && !token && n2 / (2 * cs) >= 64) CU_ASSERT(rows * 2 * cs > sms[s]);
                }
}

/* The launch caps' index and its inverse: every (shape, quantized,
 * all-reduce) has its own index, within the BM_TP_NCAPS of a count of
 * launch shapes, and decodes back to itself; index ns is the all-gather
 * kernel's. */
static void test_cap_index(void)
{
    static const int counts[] = {1, 2, 18, 31};
    int k, shape, q, ar;
    for (k = 0; k < (int)(sizeof counts / sizeof counts[0]); k++) {
        const int ns = counts[k];
        int seen[4 * 31 + 1] = {0}, dq, dar;
        for (ar = 0; ar < 2; ar++)
            for (q = 0; q < 2; q++)
                for (shape = 0; shape < ns; shape++) {
                    const int i = bm_tp_cap_index(ns, shape, q, ar);
                    CU_ASSERT(i >= 0 && i < 4 * ns + 1 && i != ns);
                    if (i < 0 || i >= 4 * ns + 1) continue;
                    CU_ASSERT_EQUAL(seen[i]++, 0);
                    CU_ASSERT_EQUAL(bm_tp_cap_shape(ns, i, &dq, &dar), shape);
                    if (dq != q || dar != ar)
                        fprintf(stderr, "ns=%d shape %d q %d ar %d: index %d decodes as q %d ar %d\n", ns, shape, q,
                                ar, i, dq, dar);
                    CU_ASSERT(dq == q && dar == ar);
                }
        CU_ASSERT_EQUAL(bm_tp_cap_shape(ns, ns, &dq, &dar), ns);
        CU_ASSERT(!dq && !dar);
    }
}

int main(void)
{
    static const suite_test tests[] = {{"by hand", test_by_hand},
                                       {"within one wave", test_wave},
                                       {"the launch caps' index", test_cap_index},
                                       {NULL, NULL}};
    return suite_run("tp_shape", tests);
}
