/* Tensor statistics in one pass over memory: min, max, sum, sum of squares and NaN/+Inf/-Inf counts,
 * and, in the same pass where asked, the tensor's 64-bit fingerprint (torchdebug/checksum.py).
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
 * td_stats_hash_<dtype>(data, ndim, sizes, strides, positions, out, fingerprint, threads): the same,
 * and the fingerprint in the same pass. positions[d]: how far one step along walk dimension d moves
 * in the logical (row-major) order of the elements, which the fingerprint depends on; the walk is in
 * memory order, so a transposed view is read without copying. td_hash_w<bytes>(data, ndim, sizes,
 * strides, positions, threads): the fingerprint alone, of elements (words) of 1, 2, 4 or 8 bytes
 * (any dtype: the fingerprint reads bits). The fingerprint: word w at logical position i (from 1)
 * contributes mix(w + i * GAMMA), splitmix64's finaliser; the result is mix of the sum modulo 2**64,
 * which no order of addition changes, so threads and runs of any shape give the same bits.
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
    uint64_t hash; /* sum of the fingerprint's contributions, modulo 2**64 */
} acc_t;

#define GAMMA 0x9E3779B97F4A7C15ULL
#define MIX1 0xBF58476D1CE4E5B9ULL
#define MIX2 0x94D049BB133111EBULL

/* splitmix64's finaliser: a bijection of 64-bit words with full avalanche. */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * MIX1;
    z = (z ^ (z >> 27)) * MIX2;
    return z ^ (z >> 31);
}

static inline uint64_t word_u8(const void *p, int64_t i) { return ((const uint8_t *)p)[i]; }
static inline uint64_t word_u16(const void *p, int64_t i) { return ((const uint16_t *)p)[i]; }
static inline uint64_t word_u32(const void *p, int64_t i) { return ((const uint32_t *)p)[i]; }
static inline uint64_t word_u64(const void *p, int64_t i) { return ((const uint64_t *)p)[i]; }

/* The fingerprint's lanes: element i + l of a run contributes mix(word + base + offset[l]) with
 * base = key0 + i * step and offset[l] = l * step, modulo 2**64 (key0 = (position of element 0 + 1)
 * * GAMMA, step = the run's dimension's logical step * GAMMA). HASH_LANES adds LANES elements from
 * i; HASH_TAIL the rest, one by one. The words are widened into a buffer first, and the lanes share
 * one base: GCC 12.2 at -O3 with AVX2 vectorised a loop that widened bytes straight into per-lane
 * keys wrongly (wrong sums from the second block of lanes on; tests/test_native.py checks every
 * width against the torch-op reference). */
#define HASH_START(key0, step)                                                                       \
    uint64_t hash_sum[LANES] = {0}, hash_offset[LANES], hash_base = (key0);                         \
    for (int l = 0; l < LANES; l++) hash_offset[l] = (uint64_t)l * (step);                           \
    const uint64_t hash_advance = (step) * LANES

#define HASH_LANES(WORD, x, i)                                                                       \
    {                                                                                                \
        uint64_t words[LANES];                                                                       \
        for (int l = 0; l < LANES; l++) words[l] = WORD(x, (i) + l);                                 \
        for (int l = 0; l < LANES; l++) hash_sum[l] += mix64(words[l] + hash_base + hash_offset[l]); \
        hash_base += hash_advance;                                                                   \
    }

#define HASH_TAIL(WORD, x, i, n, key0, step, acc)                                                    \
    do {                                                                                             \
        uint64_t hash = 0;                                                                           \
        for (int l = 0; l < LANES; l++) hash += hash_sum[l];                                         \
        for (int64_t j = (i); j < (n); j++) hash += mix64(WORD(x, j) + (key0) + (uint64_t)j * (step)); \
        (acc)->hash += hash;                                                                         \
    } while (0)

static inline float load_f32(const void *p, int64_t i) { return ((const float *)p)[i]; }

static inline float load_bf16(const void *p, int64_t i) {
    uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static inline double load_f64(const void *p, int64_t i) { return ((const double *)p)[i]; }

/* One contiguous run, no NaN/Inf bookkeeping. ACC: float for 32-bit and narrower, double for float64.
 * COPY: also copy the run's elements (TYPE, bit for bit) to dst in the same pass. HASH: also add the
 * fingerprint's contributions of the run's elements (read as WORD) to acc->hash. */
#define FAST_RUN(NAME, LOAD, ACC, TYPE, COPY, HASH, WORD)                                            \
    MULTIVERSION static void NAME(const void *x, void *dst, int64_t n, acc_t *acc, uint64_t key0,    \
                                  uint64_t step) {                                                   \
        (void)key0;                                                                                  \
        (void)step;                                                                                  \
        ACC mn[LANES], mx[LANES];                                                                    \
        for (int l = 0; l < LANES; l++) {                                                            \
            mn[l] = INFINITY;                                                                        \
            mx[l] = -INFINITY;                                                                       \
        }                                                                                            \
        HASH_START(key0, step);                                                                      \
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
                if (HASH) HASH_LANES(WORD, x, i)                                                     \
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
        if (HASH) HASH_TAIL(WORD, x, i, n, key0, step, acc);                                         \
        if (COPY) memcpy((TYPE *)dst + i, (const TYPE *)x + i, (size_t)(n - i) * sizeof(TYPE));      \
        for (; i < n; i++) {                                                                         \
            double v = LOAD(x, i);                                                                   \
            if (v < acc->low) acc->low = v;                                                          \
            if (v > acc->high) acc->high = v;                                                        \
            acc->sum += v;                                                                           \
            acc->squares += v * v;                                                                   \
        }                                                                                            \
    }

/* One contiguous run of WORDs: the fingerprint's contributions only (no statistics). */
#define HASH_RUN(NAME, WORD)                                                                         \
    MULTIVERSION static void NAME(const void *x, void *unused, int64_t n, acc_t *acc, uint64_t key0, \
                                  uint64_t step) {                                                   \
        (void)unused;                                                                                \
        HASH_START(key0, step);                                                                      \
        int64_t i = 0;                                                                               \
        for (; i + LANES <= n; i += LANES) HASH_LANES(WORD, x, i)                                    \
        HASH_TAIL(WORD, x, i, n, key0, step, acc);                                                   \
    }

/* One contiguous run, double accumulation, NaN left out and counted, infinities counted. Written
 * without branches so that it vectorises (a masked softmax input holds -inf in every row). */
#define CAREFUL_RUN(NAME, LOAD)                                                                      \
    MULTIVERSION static void NAME(const void *x, void *unused, int64_t n, acc_t *acc, uint64_t key0, \
                                  uint64_t step) {                                                   \
        (void)unused;                                                                                \
        (void)key0;                                                                                  \
        (void)step;                                                                                  \
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

/* Calls RUN on every contiguous run of the tensor (an odometer over the outer dimensions), with the
 * fingerprint's key of the run's first element and its step when positions is not NULL. */
#define WALK(RUN, ELEMENT_SIZE)                                                                      \
    do {                                                                                             \
        int64_t index[MAX_DIMS] = {0};                                                               \
        for (;;) {                                                                                   \
            int64_t offset = 0;                                                                      \
            uint64_t position = 0;                                                                   \
            for (int d = 0; d < ndim - 1; d++) offset += index[d] * strides[d];                      \
            if (positions)                                                                           \
                for (int d = 0; d < ndim - 1; d++) position += (uint64_t)index[d] * (uint64_t)positions[d]; \
            uint64_t step = positions ? (uint64_t)positions[ndim - 1] * GAMMA : 0;                   \
            RUN(data + offset * (ELEMENT_SIZE), NULL, sizes[ndim - 1], &acc, (position + 1) * GAMMA, step); \
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

typedef void (*run_fn)(const void *x, void *dst, int64_t n, acc_t *acc, uint64_t key0, uint64_t step);

static const acc_t ACC_INIT = {INFINITY, -INFINITY, 0.0, 0.0, 0, 0, 0, 0};

#ifdef _OPENMP
static void merge(acc_t *into, const acc_t *part) {
    if (part->low < into->low) into->low = part->low;
    if (part->high > into->high) into->high = part->high;
    into->sum += part->sum;
    into->squares += part->squares;
    into->nan += part->nan;
    into->posinf += part->posinf;
    into->neginf += part->neginf;
    into->hash += part->hash;
}
#endif

/* RUN over n contiguous elements (and dst, when copying), one chunk per thread of torch's pool;
 * key0 and step: the fingerprint's key of element 0 and its step (see HASH_START). */
static acc_t run_split(run_fn run, const char *src, char *dst, int64_t n, size_t element_size, int threads,
                       uint64_t key0, uint64_t step) {
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
                run(src + begin * element_size, dst ? dst + begin * element_size : NULL, end - begin, &parts[t],
                    key0 + (uint64_t)begin * step, step);
            if (t == 0) used = k;
        }
        for (int t = 0; t < used; t++) merge(&total, &parts[t]);
        return total;
    }
#else
    (void)element_size;
    (void)threads;
#endif
    run(src, dst, n, &total, key0, step);
    return total;
}

/* Statistics over the walk (into out, when not NULL) and the fingerprint (into hash, when positions
 * is not NULL). The fast pass takes the fingerprint; a careful pass after it only redoes the
 * statistics. Returns 1 when the careful pass ran. */
#define WALK_STATS(NAME, FAST_NAME, CAREFUL_NAME, TYPE)                                              \
    static int NAME(const void *x, int ndim, const int64_t *sizes, const int64_t *strides,           \
                    const int64_t *positions, double *out, uint64_t *hash, int threads) {            \
        const char *data = (const char *)x;                                                          \
        int64_t numel = 1;                                                                           \
        for (int d = 0; d < ndim; d++) numel *= sizes[d];                                            \
        uint64_t step = positions ? (uint64_t)positions[0] * GAMMA : 0;                              \
        acc_t acc;                                                                                   \
        if (ndim == 1) {                                                                             \
            acc = run_split(FAST_NAME, data, NULL, numel, sizeof(TYPE), threads, GAMMA, step);       \
        } else {                                                                                     \
            acc = ACC_INIT;                                                                          \
            WALK(FAST_NAME, sizeof(TYPE));                                                           \
        }                                                                                            \
        if (positions) *hash = mix64(acc.hash);                                                      \
        int careful = out && needs_care(&acc);                                                       \
        if (careful && ndim == 1) {                                                                  \
            acc = run_split(CAREFUL_NAME, data, NULL, numel, sizeof(TYPE), threads, 0, 0);           \
        } else if (careful) {                                                                        \
            acc = ACC_INIT;                                                                          \
            WALK(CAREFUL_NAME, sizeof(TYPE));                                                        \
        }                                                                                            \
        if (out) finish(&acc, numel, out);                                                           \
        return careful;                                                                              \
    }

#define STATS(NAME, WALK_NAME)                                                                       \
    int NAME(const void *x, int ndim, const int64_t *sizes, const int64_t *strides, double *out,     \
             int threads) {                                                                          \
        return WALK_NAME(x, ndim, sizes, strides, NULL, out, NULL, threads);                         \
    }

#define STATS_HASH(NAME, WALK_NAME)                                                                  \
    int NAME(const void *x, int ndim, const int64_t *sizes, const int64_t *strides,                  \
             const int64_t *positions, double *out, uint64_t *hash, int threads) {                   \
        return WALK_NAME(x, ndim, sizes, strides, positions, out, hash, threads);                    \
    }

#define HASH(NAME, WALK_NAME)                                                                        \
    uint64_t NAME(const void *x, int ndim, const int64_t *sizes, const int64_t *strides,             \
                  const int64_t *positions, int threads) {                                           \
        uint64_t hash = 0;                                                                           \
        WALK_NAME(x, ndim, sizes, strides, positions, NULL, &hash, threads);                         \
        return hash;                                                                                 \
    }

/* td_copy_stats_<dtype>(src, n, dst, out, threads): copy n contiguous elements to dst and take
 * their statistics in the same pass (a tensor snapshot costs one read of the tensor, not two). */
#define COPY_STATS(NAME, COPY_NAME, CAREFUL_NAME, TYPE)                                              \
    int NAME(const void *src, int64_t n, void *dst, double *out, int threads) {                      \
        acc_t acc = run_split(COPY_NAME, (const char *)src, (char *)dst, n, sizeof(TYPE), threads, 0, 0); \
        int careful = needs_care(&acc);                                                              \
        if (careful) acc = run_split(CAREFUL_NAME, (const char *)dst, NULL, n, sizeof(TYPE), threads, 0, 0); \
        finish(&acc, n, out);                                                                        \
        return careful;                                                                              \
    }

FAST_RUN(fast_f32, load_f32, float, float, 0, 0, word_u32)
FAST_RUN(fast_bf16, load_bf16, float, uint16_t, 0, 0, word_u16)
FAST_RUN(fast_f64, load_f64, double, double, 0, 0, word_u64)
FAST_RUN(fast_hash_f32, load_f32, float, float, 0, 1, word_u32)
FAST_RUN(fast_hash_bf16, load_bf16, float, uint16_t, 0, 1, word_u16)
FAST_RUN(fast_hash_f64, load_f64, double, double, 0, 1, word_u64)
FAST_RUN(copy_f32, load_f32, float, float, 1, 0, word_u32)
FAST_RUN(copy_bf16, load_bf16, float, uint16_t, 1, 0, word_u16)
FAST_RUN(copy_f64, load_f64, double, double, 1, 0, word_u64)
CAREFUL_RUN(careful_f32, load_f32)
CAREFUL_RUN(careful_bf16, load_bf16)
CAREFUL_RUN(careful_f64, load_f64)
HASH_RUN(hash_u8, word_u8)
HASH_RUN(hash_u16, word_u16)
HASH_RUN(hash_u32, word_u32)
HASH_RUN(hash_u64, word_u64)
WALK_STATS(walk_f32, fast_f32, careful_f32, float)
WALK_STATS(walk_bf16, fast_bf16, careful_bf16, uint16_t)
WALK_STATS(walk_f64, fast_f64, careful_f64, double)
WALK_STATS(walk_hash_f32, fast_hash_f32, careful_f32, float)
WALK_STATS(walk_hash_bf16, fast_hash_bf16, careful_bf16, uint16_t)
WALK_STATS(walk_hash_f64, fast_hash_f64, careful_f64, double)
WALK_STATS(walk_u8, hash_u8, hash_u8, uint8_t)
WALK_STATS(walk_u16, hash_u16, hash_u16, uint16_t)
WALK_STATS(walk_u32, hash_u32, hash_u32, uint32_t)
WALK_STATS(walk_u64, hash_u64, hash_u64, uint64_t)
STATS(td_stats_f32, walk_f32)
STATS(td_stats_bf16, walk_bf16)
STATS(td_stats_f64, walk_f64)
STATS_HASH(td_stats_hash_f32, walk_hash_f32)
STATS_HASH(td_stats_hash_bf16, walk_hash_bf16)
STATS_HASH(td_stats_hash_f64, walk_hash_f64)
HASH(td_hash_w1, walk_u8)
HASH(td_hash_w2, walk_u16)
HASH(td_hash_w4, walk_u32)
HASH(td_hash_w8, walk_u64)
COPY_STATS(td_copy_stats_f32, copy_f32, careful_f32, float)
COPY_STATS(td_copy_stats_bf16, copy_bf16, careful_bf16, uint16_t)
COPY_STATS(td_copy_stats_f64, copy_f64, careful_f64, double)
