/* Tensor statistics in one pass over memory: min, max, sum, sum of squares and NaN/+Inf/-Inf counts.
 *
 * Built and loaded by torchdebug/native/build.py (plain C, no torch headers, called through ctypes,
 * which releases the GIL). A tensor is walked as runs of contiguous elements: the innermost
 * dimension has stride 1, the outer ones any stride (views, slices, broadcasts). The fast loop
 * keeps LANES independent accumulators, so compilers vectorise it without -ffast-math, and adds
 * each block's sums into doubles. NaN fails every comparison, so min/max skip it on their own; a
 * sum that comes out non-finite (some NaN or Inf) or a sum of squares that underflowed sends the
 * tensor through the careful loop, which counts NaN/Inf and accumulates in double. Semantics match
 * torchdebug.stats.stats_vector: NaNs are left out of min, max, sum and norm; infinities are kept.
 *
 * td_stats_<dtype>(data, ndim, sizes, strides, out, threads): strides in elements,
 * strides[ndim-1] == 1, ndim <= MAX_DIMS; out[7] = {min, max, sum, sum of squares, nan, posinf,
 * neginf}, min/max NaN when every element is NaN; threads: how many threads may share the work
 * (torch.get_num_threads(): a thread other than the one torch.set_num_threads ran on would read
 * OpenMP's own default, all cores). Returns 1 when the careful loop ran.
 *
 * Built with -fopenmp where torch runs on GNU OpenMP (build.py checks), so the parallel regions
 * below share torch's own thread pool: a contiguous tensor of at least PARALLEL_MIN elements is cut
 * into one chunk per thread, in order, as at::parallel_for cuts the op that produced it, so each
 * thread mostly reads what its core just wrote. The partial sums are merged in thread order: the
 * same thread count gives the same result on every run.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define LANES 16
#define BLOCK 4096
#define MAX_DIMS 16
#define PARALLEL_MIN 65536 /* elements; smaller tensors take one thread (a region costs microseconds) */
#define MAX_THREADS 64
#define CHUNK_ALIGN 64 /* chunk boundaries in elements, so every chunk but the last is whole blocks */

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define MULTIVERSION
#endif

typedef struct {
    double low, high, sum, squares;
    int64_t nan, posinf, neginf;
} acc_t;

static inline float load_f32(const void *p, int64_t i) { return ((const float *)p)[i]; }

static inline float load_bf16(const void *p, int64_t i) {
    uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static inline double load_f64(const void *p, int64_t i) { return ((const double *)p)[i]; }

/* One contiguous run, no NaN/Inf bookkeeping. ACC: float for 32-bit and narrower, double for float64.
 * COPY: also copy the run's elements (TYPE, bit for bit) to dst in the same pass. */
#define FAST_RUN(NAME, LOAD, ACC, TYPE, COPY)                                                        \
    MULTIVERSION static void NAME(const void *x, void *dst, int64_t n, acc_t *acc) {                       \
        ACC mn[LANES], mx[LANES];                                                                    \
        for (int l = 0; l < LANES; l++) {                                                            \
            mn[l] = INFINITY;                                                                        \
            mx[l] = -INFINITY;                                                                       \
        }                                                                                            \
        int64_t i = 0;                                                                               \
        while (i + LANES <= n) {                                                                     \
            int64_t end = i + BLOCK < n ? i + BLOCK : n;                                             \
            ACC block_sum[LANES] = {0}, block_squares[LANES] = {0};                                  \
            for (; i + LANES <= end; i += LANES) {                                                   \
                if (COPY) memcpy((TYPE *)dst + i, (const TYPE *)x + i, LANES * sizeof(TYPE));        \
                for (int l = 0; l < LANES; l++) {                                                    \
                    ACC v = LOAD(x, i + l);                                                          \
                    mn[l] = v < mn[l] ? v : mn[l];                                                   \
                    mx[l] = v > mx[l] ? v : mx[l];                                                   \
                    block_sum[l] += v;                                                               \
                    block_squares[l] += v * v;                                                       \
                }                                                                                    \
            }                                                                                        \
            for (int l = 0; l < LANES; l++) {                                                        \
                acc->sum += block_sum[l];                                                            \
                acc->squares += block_squares[l];                                                    \
            }                                                                                        \
        }                                                                                            \
        for (int l = 0; l < LANES; l++) {                                                            \
            if (mn[l] < acc->low) acc->low = mn[l];                                                  \
            if (mx[l] > acc->high) acc->high = mx[l];                                                \
        }                                                                                            \
        if (COPY) memcpy((TYPE *)dst + i, (const TYPE *)x + i, (size_t)(n - i) * sizeof(TYPE));      \
        for (; i < n; i++) {                                                                         \
            double v = LOAD(x, i);                                                                   \
            if (v < acc->low) acc->low = v;                                                          \
            if (v > acc->high) acc->high = v;                                                        \
            acc->sum += v;                                                                           \
            acc->squares += v * v;                                                                   \
        }                                                                                            \
    }

/* One contiguous run, double accumulation, NaN left out and counted, infinities counted. Written
 * without branches so that it vectorises (a masked softmax input holds -inf in every row). */
#define CAREFUL_RUN(NAME, LOAD)                                                                      \
    MULTIVERSION static void NAME(const void *x, void *unused, int64_t n, acc_t *acc) {                           \
        (void)unused;                                                                                \
        double low = acc->low, high = acc->high, sum = 0.0, squares = 0.0;                           \
        int64_t nan = 0, posinf = 0, neginf = 0;                                                     \
        for (int64_t i = 0; i < n; i++) {                                                            \
            double v = LOAD(x, i);                                                                   \
            int is_nan = v != v;                                                                     \
            nan += is_nan;                                                                           \
            posinf += v == INFINITY;                                                                 \
            neginf += v == -INFINITY;                                                                \
            low = v < low ? v : low; /* NaN compares false: skipped */                               \
            high = v > high ? v : high;                                                              \
            double kept = is_nan ? 0.0 : v;                                                          \
            sum += kept;                                                                             \
            squares += kept * kept;                                                                  \
        }                                                                                            \
        acc->low = low;                                                                              \
        acc->high = high;                                                                            \
        acc->sum += sum;                                                                             \
        acc->squares += squares;                                                                     \
        acc->nan += nan;                                                                             \
        acc->posinf += posinf;                                                                       \
        acc->neginf += neginf;                                                                       \
    }

/* Calls RUN on every contiguous run of the tensor (an odometer over the outer dimensions). */
#define WALK(RUN, ELEMENT_SIZE)                                                                      \
    do {                                                                                             \
        int64_t index[MAX_DIMS] = {0};                                                               \
        for (;;) {                                                                                   \
            int64_t offset = 0;                                                                      \
            for (int d = 0; d < ndim - 1; d++) offset += index[d] * strides[d];                      \
            RUN(data + offset * (ELEMENT_SIZE), NULL, sizes[ndim - 1], &acc);                        \
            int d = ndim - 2;                                                                        \
            while (d >= 0 && ++index[d] == sizes[d]) index[d--] = 0;                                 \
            if (d < 0) break;                                                                        \
        }                                                                                            \
    } while (0)

static void finish(const acc_t *acc, int64_t numel, double *out) {
    out[0] = acc->nan == numel ? NAN : acc->low;
    out[1] = acc->nan == numel ? NAN : acc->high;
    out[2] = acc->sum;
    out[3] = acc->squares;
    out[4] = (double)acc->nan;
    out[5] = (double)acc->posinf;
    out[6] = (double)acc->neginf;
}

static int needs_care(const acc_t *acc) {
    int underflow = acc->squares < 1e-30 && (acc->low < 0 || acc->high > 0);
    return !isfinite(acc->sum) || !isfinite(acc->squares) || underflow;
}

typedef void (*run_fn)(const void *x, void *dst, int64_t n, acc_t *acc);

static const acc_t ACC_INIT = {INFINITY, -INFINITY, 0.0, 0.0, 0, 0, 0};

#ifdef _OPENMP
static void merge(acc_t *into, const acc_t *part) {
    if (part->low < into->low) into->low = part->low;
    if (part->high > into->high) into->high = part->high;
    into->sum += part->sum;
    into->squares += part->squares;
    into->nan += part->nan;
    into->posinf += part->posinf;
    into->neginf += part->neginf;
}
#endif

/* RUN over n contiguous elements (and dst, when copying), one chunk per thread of torch's pool. */
static acc_t run_split(run_fn run, const char *src, char *dst, int64_t n, size_t element_size, int threads) {
    acc_t total = ACC_INIT;
#ifdef _OPENMP
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (n >= PARALLEL_MIN && threads > 1 && !omp_in_parallel()) {
        acc_t parts[MAX_THREADS];
        int used = 1;
#pragma omp parallel num_threads(threads)
        {
            int t = omp_get_thread_num(), k = omp_get_num_threads();
            int64_t chunk = (n + k - 1) / k;
            chunk = (chunk + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN;
            int64_t begin = t * chunk < n ? t * chunk : n, end = begin + chunk < n ? begin + chunk : n;
            parts[t] = ACC_INIT;
            if (end > begin)
                run(src + begin * element_size, dst ? dst + begin * element_size : NULL, end - begin, &parts[t]);
            if (t == 0) used = k;
        }
        for (int t = 0; t < used; t++) merge(&total, &parts[t]);
        return total;
    }
#else
    (void)element_size;
    (void)threads;
#endif
    run(src, dst, n, &total);
    return total;
}

#define STATS(NAME, FAST_NAME, CAREFUL_NAME, TYPE)                                                   \
    int NAME(const void *x, int ndim, const int64_t *sizes, const int64_t *strides, double *out,     \
             int threads) {                                                                          \
        const char *data = (const char *)x;                                                          \
        int64_t numel = 1;                                                                           \
        for (int d = 0; d < ndim; d++) numel *= sizes[d];                                            \
        acc_t acc;                                                                                   \
        if (ndim == 1) {                                                                             \
            acc = run_split(FAST_NAME, data, NULL, numel, sizeof(TYPE), threads);                           \
        } else {                                                                                     \
            acc = ACC_INIT;                                                                          \
            WALK(FAST_NAME, sizeof(TYPE));                                                           \
        }                                                                                            \
        int careful = needs_care(&acc);                                                              \
        if (careful && ndim == 1) {                                                                  \
            acc = run_split(CAREFUL_NAME, data, NULL, numel, sizeof(TYPE), threads);                        \
        } else if (careful) {                                                                        \
            acc = ACC_INIT;                                                                          \
            WALK(CAREFUL_NAME, sizeof(TYPE));                                                        \
        }                                                                                            \
        finish(&acc, numel, out);                                                                    \
        return careful;                                                                              \
    }

/* td_copy_stats_<dtype>(src, n, dst, out, threads): copy n contiguous elements to dst and take
 * their statistics in the same pass (a tensor snapshot costs one read of the tensor, not two). */
#define COPY_STATS(NAME, COPY_NAME, CAREFUL_NAME, TYPE)                                              \
    int NAME(const void *src, int64_t n, void *dst, double *out, int threads) {                      \
        acc_t acc = run_split(COPY_NAME, (const char *)src, (char *)dst, n, sizeof(TYPE), threads);  \
        int careful = needs_care(&acc);                                                              \
        if (careful) acc = run_split(CAREFUL_NAME, (const char *)dst, NULL, n, sizeof(TYPE), threads); \
        finish(&acc, n, out);                                                                        \
        return careful;                                                                              \
    }

FAST_RUN(fast_f32, load_f32, float, float, 0)
FAST_RUN(fast_bf16, load_bf16, float, uint16_t, 0)
FAST_RUN(fast_f64, load_f64, double, double, 0)
FAST_RUN(copy_f32, load_f32, float, float, 1)
FAST_RUN(copy_bf16, load_bf16, float, uint16_t, 1)
FAST_RUN(copy_f64, load_f64, double, double, 1)
CAREFUL_RUN(careful_f32, load_f32)
CAREFUL_RUN(careful_bf16, load_bf16)
CAREFUL_RUN(careful_f64, load_f64)
STATS(td_stats_f32, fast_f32, careful_f32, float)
STATS(td_stats_bf16, fast_bf16, careful_bf16, uint16_t)
STATS(td_stats_f64, fast_f64, careful_f64, double)
COPY_STATS(td_copy_stats_f32, copy_f32, careful_f32, float)
COPY_STATS(td_copy_stats_bf16, copy_bf16, careful_bf16, uint16_t)
COPY_STATS(td_copy_stats_f64, copy_f64, careful_f64, double)
