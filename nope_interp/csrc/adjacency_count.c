/* Exact adjacency counts by merge-sort pair counting (one row at a time).
 *
 * For row k of an n x n similarity matrix, count #{i < j < k : sim[k, i] < sim[k, j]} (ties fail).
 * The row's first k entries are merge-sorted bottom-up; when a run of earlier columns (left) is merged
 * with the run of later columns that follows it (right), every right element that is output has exactly
 * the already-output left elements strictly below it (equal left elements are output after it), so the
 * count of ordered pairs is accumulated during the merges. O(k log k) per row, two buffers of n doubles.
 * Runs of RUN entries are first counted by all-pairs comparison and sorted by insertion.
 *
 * Built at run time by nope_interp/ckernel.py (any C99 compiler); called through ctypes, which releases
 * the GIL, so Python threads can count disjoint row ranges in parallel.
 */
#include <stdint.h>
#include <string.h>

#define RUN 8

static int64_t sort_and_count(double *a, double *tmp, int64_t m) {
    int64_t count = 0;
    for (int64_t lo = 0; lo < m; lo += RUN) {  /* short runs: all pairs, then insertion sort */
        int64_t hi = lo + RUN < m ? lo + RUN : m;
        for (int64_t j = lo + 1; j < hi; j++) {
            double v = a[j];
            for (int64_t i = lo; i < j; i++) count += a[i] < v;
        }
        for (int64_t j = lo + 1; j < hi; j++) {
            double v = a[j];
            int64_t i = j - 1;
            while (i >= lo && a[i] > v) { a[i + 1] = a[i]; i--; }
            a[i + 1] = v;
        }
    }
    for (int64_t w = RUN; w < m; w *= 2) {
        for (int64_t lo = 0; lo + w < m; lo += 2 * w) {
            int64_t mid = lo + w, hi = lo + 2 * w < m ? lo + 2 * w : m;
            int64_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) {  /* branch-free step: the comparison is unpredictable */
                double x = a[i], y = a[j];
                int64_t left = x < y;
                tmp[o++] = left ? x : y;
                count += (1 - left) * (i - lo);
                i += left;
                j += 1 - left;
            }
            while (i < mid) tmp[o++] = a[i++];
            while (j < hi) { count += mid - lo; tmp[o++] = a[j++]; }
            memcpy(a + lo, tmp + lo, (size_t)(hi - lo) * sizeof(double));
        }
    }
    return count;
}

/* sim: [batch, n, n] C-contiguous float64; out: [batch, n] int64; rows first..last-1 of the flattened
 * (batch * n) rows are counted; buf: 2 * n doubles of scratch owned by the caller. */
void adjacency_count_rows(const double *sim, int64_t n, int64_t first, int64_t last, int64_t *out, double *buf) {
    double *a = buf, *tmp = buf + n;
    for (int64_t r = first; r < last; r++) {
        int64_t k = r % n;
        if (k < 2) { out[r] = 0; continue; }
        memcpy(a, sim + r * n, (size_t)k * sizeof(double));
        out[r] = sort_and_count(a, tmp, k);
    }
}
