/* Tensor statistics in one pass over memory: min, max, sum, sum of squares, NaN/+Inf/-Inf counts and
 * the count of exact zeros (-0.0 included), and, in the same pass where asked, the tensor's 64-bit
 * fingerprint (torchdebug/checksum.py).
 *
 * Built and loaded by torchdebug/native/build.py (plain C, no torch headers, called through ctypes,
 * which releases the GIL). A tensor is walked as runs of contiguous elements: the innermost
 * dimension has stride 1, the outer ones any stride (views, slices, broadcasts). The fast loop
 * keeps LANES independent accumulators, so compilers vectorise it without -ffast-math, and adds
 * each block's sums into doubles; it is built for AVX-512, AVX2 and plain x86-64 (MULTIVERSION,
 * the CPU's best taken when the library loads), which give the same bits: each lane adds its
 * elements in the same order, and ISO C (-std=c99) fuses no multiply into an add. NaN fails every
 * comparison, so min/max skip it on their own; a sum that comes out non-finite (some NaN or Inf) or
 * a sum of squares that underflowed sends the tensor through the careful loop, which counts NaN/Inf
 * and accumulates in double. Semantics match torchdebug.stats._torch_ops.device_sums: NaNs are left
 * out of min, max, sum and squares; infinities are kept.
 *
 * td_stats_columns(): the columns every out[] below holds, in order, as COLUMNS spells them; the
 * binding checks them against torchdebug/stats/_schema.py when the library loads, so a column added
 * there and not here (or the reverse) fails loudly instead of shifting the numbers.
 *
 * td_stats_<dtype>(data, ndim, sizes, strides, out, threads): strides in elements,
 * strides[ndim-1] == 1, ndim <= MAX_DIMS; out[]: the columns above, min/max NaN when
 * every element is NaN; threads: how many threads may share the work
 * (torch.get_num_threads(): a thread other than the one torch.set_num_threads ran on would read
 * OpenMP's own default, all cores). Returns 1 when the careful loop ran.
 *
 * td_stats_hash_<dtype>(data, ndim, sizes, strides, positions, out, fingerprint, threads): the same,
 * and the fingerprint in the same pass. positions[d]: how far one step along walk dimension d moves
 * in the logical (row-major) order of the elements, which the fingerprint depends on; the walk is in
 * memory order, so a transposed view is read without copying. td_hash_w<bytes>(data, ndim, sizes,
 * strides, positions, threads): the fingerprint alone, of elements of 1, 2, 4 or 8 bytes (any
 * dtype: the fingerprint reads bits). The fingerprint (fingerprint 2, torchdebug/checksum.py): the
 * elements' 32-bit words (narrow elements widened, 8-byte ones as two), the word at logical word
 * position p contributing the 32 x 32 -> 64-bit product contribution() below, keyed by
 * (p + 1) * GAMMA; the result is splitmix64's finaliser of the sum modulo 2**64 (which no order of
 * addition changes, so threads and runs of any shape give the same bits) plus the word count
 * times GAMMA.
 *
 * td_finish_sums(): the statistics of many records from sums taken before, by field (at the end).
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
#define MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MULTIVERSION
#endif

#define COLUMNS "min,max,sum,squares,nan,posinf,neginf,zeros"
#define SUMS_WIDTH 8 /* the columns COLUMNS names */

const char *td_stats_columns(void) { return COLUMNS; }

typedef struct {
    double low, high, sum, squares;
    int64_t nan, posinf, neginf, zeros;
    uint64_t hash; /* sum of the fingerprint's contributions, modulo 2**64 */
} acc_t;

#define GAMMA 0x9E3779B97F4A7C15ULL
#define MIX1 0xBF58476D1CE4E5B9ULL
#define MIX2 0x94D049BB133111EBULL

/* td_fingerprint_version(): the definition below (torchdebug/checksum.py's FINGERPRINT_VERSION; the
 * binding checks them against each other when the library loads). */
int td_fingerprint_version(void) { return 2; }

/* splitmix64's finaliser: a bijection of 64-bit words with full avalanche (once a tensor). */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * MIX1;
    z = (z ^ (z >> 27)) * MIX2;
    return z ^ (z >> 31);
}

/* The fingerprint's contribution of 32-bit word w whose key is k = (its word position + 1) * GAMMA
 * modulo 2**64: with h = the key's high half and b = (its low half XOR h) | 1, the 32 x 32 -> 64-bit
 * product (w XOR h) * b. One 32-bit multiply a word (vpmuludq on AVX2 and AVX-512; on GPUs a
 * mul.lo.u32 and a mul.hi.u32). */
static inline uint64_t contribution(uint32_t w, uint64_t k) {
    uint32_t h = (uint32_t)(k >> 32);
    return (uint64_t)(w ^ h) * (((uint32_t)k ^ h) | 1u);
}

/* The fingerprint's sum, modulo 2**64, over `rows` rows of `row` contiguous elements of one width,
 * each row right after the one before in memory: element j of row r has its first word keyed
 * keys[r] + j * step (keys[r]: the key of the row's first word, step: GAMMA times the words between
 * the logical positions of consecutive elements); a run is one row. An element of 1, 2 or 4 bytes
 * is one word (zero-extended); one of 8 bytes is two, its low half first, the second keyed GAMMA
 * after the first. Portable lanes first (compilers vectorise them), then hand-written AVX2 and
 * AVX-512, which run the multiplies as vpmuludq on four or eight words at a time (one core of a
 * 2-core AVX-512 machine: 0.22 and 0.16 ns a float32 element, against 1.0 for fingerprint 1's two
 * 64-bit multiplies an element). The lanes' keys are set up once a call and moved to each row by
 * an add: a transposed view's rows of 64 elements cost a few instructions more a row, not a call
 * each (hash_rows). hashers[] holds the one chosen for each width when the library loads. */
typedef uint64_t (*hash_fn)(const void *x, int64_t row, int64_t rows, const uint64_t *keys, uint64_t step);

#define ELEMENT_SUM(WORD_TYPE, v, k)                                                                 \
    (sizeof(WORD_TYPE) == 8 ? contribution((uint32_t)(v), (k)) + contribution((uint32_t)((uint64_t)(v) >> 32), (k) + GAMMA) \
                            : contribution((uint32_t)(v), (k)))

/* The portable lanes share one base key per LANES elements: GCC 12.2 at -O3 with AVX2 vectorised
 * per-lane keys fed by bytes wrongly (tests check every width against the torch-op reference). */
#define HASH_WORDS(NAME, WORD_TYPE)                                                                  \
    MULTIVERSION static uint64_t NAME(const void *x, int64_t row, int64_t rows, const uint64_t *keys, \
                                      uint64_t step) {                                               \
        const WORD_TYPE *w = (const WORD_TYPE *)x;                                                   \
        uint64_t sum[LANES] = {0}, offset[LANES], total = 0;                                         \
        for (int l = 0; l < LANES; l++) offset[l] = (uint64_t)l * step;                              \
        const uint64_t advance = step * LANES;                                                       \
        for (int64_t r = 0; r < rows; r++, w += row) {                                               \
            uint64_t base = keys[r];                                                                 \
            int64_t i = 0;                                                                           \
            for (; i + LANES <= row; i += LANES) {                                                   \
                for (int l = 0; l < LANES; l++) sum[l] += ELEMENT_SUM(WORD_TYPE, w[i + l], base + offset[l]); \
                base += advance;                                                                     \
            }                                                                                        \
            for (; i < row; i++) total += ELEMENT_SUM(WORD_TYPE, w[i], keys[r] + (uint64_t)i * step); \
        }                                                                                            \
        for (int l = 0; l < LANES; l++) total += sum[l];                                             \
        return total;                                                                                \
    }

HASH_WORDS(hash_words_u8, uint8_t)
HASH_WORDS(hash_words_u16, uint16_t)
HASH_WORDS(hash_words_u32, uint32_t)
HASH_WORDS(hash_words_u64, uint64_t)

/* The hasher of each element width in bytes (1, 2, 4, 8). */
static hash_fn hashers[9] = {NULL, hash_words_u8, hash_words_u16, NULL, hash_words_u32, NULL, NULL, NULL, hash_words_u64};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2")))
#define PREFETCH_AHEAD 16384 /* bytes: the next block of statistics while this one is hashed */

/* contribution() of the word in the low half of each 64-bit lane of w, keyed by that lane of k. */
AVX2 static inline __m256i contribution4(__m256i w, __m256i k) {
    __m256i h = _mm256_srli_epi64(k, 32);
    __m256i b = _mm256_or_si256(_mm256_xor_si256(k, h), _mm256_set1_epi64x(1));
    return _mm256_mul_epu32(_mm256_xor_si256(w, h), b); /* the low halves only: 32 x 32 -> 64 bits */
}

/* Eight words from p as the eight 32-bit lanes of a vector (narrow elements zero-extended). */
AVX2 static inline __m256i load8_u8(const void *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
AVX2 static inline __m256i load8_u16(const void *p) { return _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)); }
AVX2 static inline __m256i load8_u32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 16 words an iteration, in two vectors of eight: the even 32-bit lanes of each (keys in even[])
 * and its odd lanes shifted down (keys in odd[]), four sums in flight. For elements of 1, 2 or 4
 * bytes, ELEMENTS (8) elements a vector, lane l keyed key0 + l * step; for 8-byte elements, 4 a
 * vector, the even lanes their low halves (key0 + l * step), the odd ones their high halves
 * (GAMMA further). */
#define HASH_WORDS_AVX2(NAME, WORD_TYPE, LOAD8, ELEMENTS)                                            \
    AVX2 static uint64_t NAME(const void *x, int64_t row, int64_t rows, const uint64_t *keys, uint64_t step) { \
        const WORD_TYPE *w = (const WORD_TYPE *)x;                                                   \
        __m256i even_offset[2], odd_offset[2], sum[4];                                               \
        for (int v = 0; v < 2; v++) {                                                                \
            uint64_t k = (uint64_t)(v * ELEMENTS) * step, lane[8];                                   \
            for (int l = 0; l < 8; l++)                                                              \
                lane[l] = ELEMENTS == 8 ? k + (uint64_t)l * step : k + (uint64_t)(l / 2) * step + (l % 2) * GAMMA; \
            even_offset[v] = _mm256_set_epi64x((long long)lane[6], (long long)lane[4], (long long)lane[2], (long long)lane[0]); \
            odd_offset[v] = _mm256_set_epi64x((long long)lane[7], (long long)lane[5], (long long)lane[3], (long long)lane[1]); \
        }                                                                                            \
        for (int s = 0; s < 4; s++) sum[s] = _mm256_setzero_si256();                                 \
        const __m256i advance = _mm256_set1_epi64x((long long)(2 * ELEMENTS * step));                \
        uint64_t total = 0;                                                                          \
        for (int64_t r = 0; r < rows; r++, w += row) {                                               \
            const __m256i base = _mm256_set1_epi64x((long long)keys[r]);                             \
            __m256i even[2], odd[2];                                                                 \
            for (int v = 0; v < 2; v++) {                                                            \
                even[v] = _mm256_add_epi64(base, even_offset[v]);                                    \
                odd[v] = _mm256_add_epi64(base, odd_offset[v]);                                      \
            }                                                                                        \
            int64_t i = 0;                                                                           \
            for (; i + 2 * ELEMENTS <= row; i += 2 * ELEMENTS) {                                     \
                _mm_prefetch((const char *)(w + i) + PREFETCH_AHEAD, _MM_HINT_T0);                   \
                for (int v = 0; v < 2; v++) {                                                        \
                    __m256i words = LOAD8(w + i + v * ELEMENTS);                                     \
                    sum[2 * v] = _mm256_add_epi64(sum[2 * v], contribution4(words, even[v]));        \
                    sum[2 * v + 1] = _mm256_add_epi64(sum[2 * v + 1], contribution4(_mm256_srli_epi64(words, 32), odd[v])); \
                    even[v] = _mm256_add_epi64(even[v], advance);                                    \
                    odd[v] = _mm256_add_epi64(odd[v], advance);                                      \
                }                                                                                    \
            }                                                                                        \
            for (; i < row; i++) total += ELEMENT_SUM(WORD_TYPE, w[i], keys[r] + (uint64_t)i * step); \
        }                                                                                            \
        uint64_t lanes[4];                                                                           \
        __m256i all = _mm256_add_epi64(_mm256_add_epi64(sum[0], sum[1]), _mm256_add_epi64(sum[2], sum[3])); \
        _mm256_storeu_si256((__m256i *)lanes, all);                                                  \
        return total + lanes[0] + lanes[1] + lanes[2] + lanes[3];                                    \
    }

HASH_WORDS_AVX2(hash_words_u8_avx2, uint8_t, load8_u8, 8)
HASH_WORDS_AVX2(hash_words_u16_avx2, uint16_t, load8_u16, 8)
HASH_WORDS_AVX2(hash_words_u32_avx2, uint32_t, load8_u32, 8)
HASH_WORDS_AVX2(hash_words_u64_avx2, uint64_t, load8_u32, 4)

/* The same with AVX-512 where the CPU has it: 16 words a vector, and the multiplier's XOR and OR in
 * one ternary-logic instruction (13 instructions for 16 words where AVX2 takes 30). */
#define AVX512 __attribute__((target("avx512f")))

AVX512 static inline __m512i contribution8(__m512i w, __m512i k) {
    __m512i h = _mm512_srli_epi64(k, 32);
    __m512i b = _mm512_ternarylogic_epi64(k, h, _mm512_set1_epi64(1), 0xBE); /* (k ^ h) | 1 */
    return _mm512_mul_epu32(_mm512_xor_si512(w, h), b);
}

AVX512 static inline __m512i load16_u8(const void *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
AVX512 static inline __m512i load16_u16(const void *p) { return _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)); }
AVX512 static inline __m512i load16_u32(const void *p) { return _mm512_loadu_si512(p); }

/* 32 words an iteration, in two vectors of 16, as HASH_WORDS_AVX2 arranges eight (the odd lanes
 * moved down by a shuffle). ELEMENTS: 16 for elements of 1, 2 or 4 bytes, 8 for 8-byte ones. */
#define HASH_WORDS_AVX512(NAME, WORD_TYPE, LOAD16, ELEMENTS)                                         \
    AVX512 static uint64_t NAME(const void *x, int64_t row, int64_t rows, const uint64_t *keys, uint64_t step) { \
        const WORD_TYPE *w = (const WORD_TYPE *)x;                                                   \
        __m512i even_offset[2], odd_offset[2], sum[4];                                               \
        for (int v = 0; v < 2; v++) {                                                                \
            uint64_t k = (uint64_t)(v * ELEMENTS) * step, lane[16];                                  \
            for (int l = 0; l < 16; l++)                                                             \
                lane[l] = ELEMENTS == 16 ? k + (uint64_t)l * step : k + (uint64_t)(l / 2) * step + (l % 2) * GAMMA; \
            even_offset[v] = _mm512_set_epi64((long long)lane[14], (long long)lane[12], (long long)lane[10], (long long)lane[8], \
                                              (long long)lane[6], (long long)lane[4], (long long)lane[2], (long long)lane[0]); \
            odd_offset[v] = _mm512_set_epi64((long long)lane[15], (long long)lane[13], (long long)lane[11], (long long)lane[9], \
                                             (long long)lane[7], (long long)lane[5], (long long)lane[3], (long long)lane[1]); \
        }                                                                                            \
        for (int s = 0; s < 4; s++) sum[s] = _mm512_setzero_si512();                                 \
        const __m512i advance = _mm512_set1_epi64((long long)(2 * ELEMENTS * step));                 \
        uint64_t lanes[8], total = 0;                                                                \
        for (int64_t r = 0; r < rows; r++, w += row) {                                               \
            const __m512i base = _mm512_set1_epi64((long long)keys[r]);                              \
            __m512i even[2], odd[2];                                                                 \
            for (int v = 0; v < 2; v++) {                                                            \
                even[v] = _mm512_add_epi64(base, even_offset[v]);                                    \
                odd[v] = _mm512_add_epi64(base, odd_offset[v]);                                      \
            }                                                                                        \
            int64_t i = 0;                                                                           \
            for (; i + 2 * ELEMENTS <= row; i += 2 * ELEMENTS) {                                     \
                _mm_prefetch((const char *)(w + i) + PREFETCH_AHEAD, _MM_HINT_T0);                   \
                for (int v = 0; v < 2; v++) {                                                        \
                    __m512i words = LOAD16(w + i + v * ELEMENTS);                                    \
                    sum[2 * v] = _mm512_add_epi64(sum[2 * v], contribution8(words, even[v]));        \
                    sum[2 * v + 1] = _mm512_add_epi64(sum[2 * v + 1], contribution8(_mm512_shuffle_epi32(words, _MM_PERM_DDBB), odd[v])); \
                    even[v] = _mm512_add_epi64(even[v], advance);                                    \
                    odd[v] = _mm512_add_epi64(odd[v], advance);                                      \
                }                                                                                    \
            }                                                                                        \
            for (; i < row; i++) total += ELEMENT_SUM(WORD_TYPE, w[i], keys[r] + (uint64_t)i * step); \
        }                                                                                            \
        __m512i all = _mm512_add_epi64(_mm512_add_epi64(sum[0], sum[1]), _mm512_add_epi64(sum[2], sum[3])); \
        _mm512_storeu_si512(lanes, all);                                                             \
        for (int l = 0; l < 8; l++) total += lanes[l];                                               \
        return total;                                                                                \
    }

HASH_WORDS_AVX512(hash_words_u8_avx512, uint8_t, load16_u8, 16)
HASH_WORDS_AVX512(hash_words_u16_avx512, uint16_t, load16_u16, 16)
HASH_WORDS_AVX512(hash_words_u32_avx512, uint32_t, load16_u32, 16)
HASH_WORDS_AVX512(hash_words_u64_avx512, uint64_t, load16_u32, 8)

#endif

static const char *hashers_picked = "portable";

/* td_pick_hashers(most): the fastest hashers this CPU runs (AVX-512, else AVX2, else portable C)
 * with most = 0; with 1 the portable ones, with 2 AVX2 at most (tests run every one: they must give
 * the same bits). Called with 0 when the library loads. td_hashers() names the ones picked. */
void td_pick_hashers(int most) {
    hashers[1] = hash_words_u8;
    hashers[2] = hash_words_u16;
    hashers[4] = hash_words_u32;
    hashers[8] = hash_words_u64;
    hashers_picked = "portable";
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (most != 1 && __builtin_cpu_supports("avx2")) {
        hashers[1] = hash_words_u8_avx2;
        hashers[2] = hash_words_u16_avx2;
        hashers[4] = hash_words_u32_avx2;
        hashers[8] = hash_words_u64_avx2;
        hashers_picked = "avx2";
    }
    if (most == 0 && __builtin_cpu_supports("avx512f")) {
        hashers[1] = hash_words_u8_avx512;
        hashers[2] = hash_words_u16_avx512;
        hashers[4] = hash_words_u32_avx512;
        hashers[8] = hash_words_u64_avx512;
        hashers_picked = "avx512";
    }
#else
    (void)most;
#endif
}

const char *td_hashers(void) { return hashers_picked; }

__attribute__((constructor)) static void pick_hashers(void) { td_pick_hashers(0); }

/* Where a walk stands in the fingerprint's keys: a run of contiguous memory is rows of the walk's
 * innermost dimension (`row` elements, keyed `step` apart), and an odometer over the dimensions
 * above it that the run covers (outermost first) gives each row's key; a run of one dimension is
 * one row (row_of_run). */
typedef struct {
    int64_t row, at;    /* elements a row; those of the current row hashed so far */
    uint64_t key, step; /* the key of the current row's first word; the step between its elements' keys */
    int dims;
    int64_t sizes[MAX_DIMS], index[MAX_DIMS];
    uint64_t steps[MAX_DIMS]; /* the key's step along each odometer dimension */
} rows_t;

static rows_t row_of_run(uint64_t key, uint64_t step) {
    rows_t rows;
    rows.row = INT64_MAX;
    rows.at = 0;
    rows.key = key;
    rows.step = step;
    rows.dims = 0;
    return rows;
}

static inline void next_row(rows_t *rows) {
    rows->at = 0;
    for (int d = rows->dims - 1; d >= 0; d--) {
        rows->key += rows->steps[d];
        if (++rows->index[d] < rows->sizes[d]) return;
        rows->key -= (uint64_t)rows->sizes[d] * rows->steps[d];
        rows->index[d] = 0;
    }
}

#define ROWS_A_CALL 64 /* whole rows handed to a hasher at once (their keys on the stack) */

/* The fingerprint's sum of the next n elements of the walk, contiguous at x, `width` bytes each;
 * moves rows on past them. A row cut by the caller's block is hashed in two pieces. */
static uint64_t hash_rows(rows_t *rows, const char *x, int64_t n, size_t width) {
    const hash_fn hash = hashers[width];
    uint64_t total = 0, keys[ROWS_A_CALL];
    if (rows->at > 0 && n > 0) {
        int64_t piece = rows->row - rows->at < n ? rows->row - rows->at : n;
        keys[0] = rows->key + (uint64_t)rows->at * rows->step;
        total += hash(x, piece, 1, keys, rows->step);
        x += piece * (int64_t)width;
        n -= piece;
        rows->at += piece;
        if (rows->at == rows->row) next_row(rows);
    }
    while (n >= rows->row) {
        int64_t whole = n / rows->row < ROWS_A_CALL ? n / rows->row : ROWS_A_CALL;
        for (int64_t r = 0; r < whole; r++) {
            keys[r] = rows->key;
            next_row(rows);
        }
        total += hash(x, rows->row, whole, keys, rows->step);
        x += whole * rows->row * (int64_t)width;
        n -= whole * rows->row;
    }
    if (n > 0) {
        total += hash(x, n, 1, &rows->key, rows->step);
        rows->at = n;
    }
    return total;
}

static inline float load_f32(const void *p, int64_t i) { return ((const float *)p)[i]; }

static inline float load_bf16(const void *p, int64_t i) {
    uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static inline double load_f64(const void *p, int64_t i) { return ((const double *)p)[i]; }

/* Integers (and bool, as uint8) are read as doubles: exact below 2**53, as torch ops take them. */
static inline double load_i64(const void *p, int64_t i) { return (double)((const int64_t *)p)[i]; }
static inline double load_i32(const void *p, int64_t i) { return (double)((const int32_t *)p)[i]; }
static inline double load_i16(const void *p, int64_t i) { return (double)((const int16_t *)p)[i]; }
static inline double load_i8(const void *p, int64_t i) { return (double)((const int8_t *)p)[i]; }
static inline double load_u8(const void *p, int64_t i) { return (double)((const uint8_t *)p)[i]; }

/* Integer lanes as wide as the ACC lanes (the zero count's compare and add stay in the same vectors). */
#define LANE_COUNT(ACC) LANE_COUNT_##ACC
#define LANE_COUNT_float int32_t
#define LANE_COUNT_double int64_t

/* One contiguous run, no NaN/Inf bookkeeping. ACC: float for 32-bit and narrower, double for float64.
 * COPY: also copy the run's elements (TYPE, bit for bit) to dst in the same pass. HASH: also add the
 * fingerprint's sum of the run's elements (see hash_fn) to acc->hash, block by block while the
 * block is in the L1 cache: memory is read once for both. */
#define FAST_RUN(NAME, LOAD, ACC, TYPE, COPY, HASH)                                                  \
    MULTIVERSION static void NAME(const void *x, void *dst, int64_t n, acc_t *acc, rows_t *rows) {   \
        (void)rows;                                                                                  \
        ACC mn[LANES], mx[LANES];                                                                    \
        for (int l = 0; l < LANES; l++) {                                                            \
            mn[l] = INFINITY;                                                                        \
            mx[l] = -INFINITY;                                                                       \
        }                                                                                            \
        int64_t i = 0;                                                                               \
        while (i + LANES <= n) {                                                                     \
            int64_t end = i + BLOCK < n ? i + BLOCK : n, begin = i;                                  \
            ACC block_sum[LANES] = {0}, block_squares[LANES] = {0};                                  \
            LANE_COUNT(ACC) block_zeros[LANES] = {0};                                                \
            for (; i + LANES <= end; i += LANES) {                                                   \
                if (COPY) memcpy((TYPE *)dst + i, (const TYPE *)x + i, LANES * sizeof(TYPE));        \
                for (int l = 0; l < LANES; l++) {                                                    \
                    ACC v = LOAD(x, i + l);                                                          \
                    mn[l] = v < mn[l] ? v : mn[l];                                                   \
                    mx[l] = v > mx[l] ? v : mx[l];                                                   \
                    block_sum[l] += v;                                                               \
                    block_squares[l] += v * v;                                                       \
                    block_zeros[l] += v == 0;                                                        \
                }                                                                                    \
            }                                                                                        \
            for (int l = 0; l < LANES; l++) {                                                        \
                acc->sum += block_sum[l];                                                            \
                acc->squares += block_squares[l];                                                    \
                acc->zeros += block_zeros[l];                                                        \
            }                                                                                        \
            if (HASH) acc->hash += hash_rows(rows, (const char *)((const TYPE *)x + begin), i - begin, sizeof(TYPE)); \
        }                                                                                            \
        for (int l = 0; l < LANES; l++) {                                                            \
            if (mn[l] < acc->low) acc->low = mn[l];                                                  \
            if (mx[l] > acc->high) acc->high = mx[l];                                                \
        }                                                                                            \
        if (HASH && i < n) acc->hash += hash_rows(rows, (const char *)((const TYPE *)x + i), n - i, sizeof(TYPE)); \
        if (COPY) memcpy((TYPE *)dst + i, (const TYPE *)x + i, (size_t)(n - i) * sizeof(TYPE));      \
        for (; i < n; i++) {                                                                         \
            double v = LOAD(x, i);                                                                   \
            if (v < acc->low) acc->low = v;                                                          \
            if (v > acc->high) acc->high = v;                                                        \
            acc->sum += v;                                                                           \
            acc->squares += v * v;                                                                   \
            acc->zeros += v == 0;                                                                    \
        }                                                                                            \
    }

/* One contiguous run of words of WIDTH bytes: the fingerprint's sum only (no statistics). */
#define HASH_RUN(NAME, WIDTH)                                                                        \
    static void NAME(const void *x, void *unused, int64_t n, acc_t *acc, rows_t *rows) {             \
        (void)unused;                                                                                \
        acc->hash += hash_rows(rows, (const char *)x, n, WIDTH);                                     \
    }

/* One contiguous run, double accumulation, NaN left out and counted, infinities counted. Written
 * without branches so that it vectorises (a masked softmax input holds -inf in every row). */
#define CAREFUL_RUN(NAME, LOAD)                                                                      \
    MULTIVERSION static void NAME(const void *x, void *unused, int64_t n, acc_t *acc, rows_t *rows) { \
        (void)unused;                                                                                \
        (void)rows;                                                                                  \
        double low = acc->low, high = acc->high, sum = 0.0, squares = 0.0;                           \
        int64_t nan = 0, posinf = 0, neginf = 0, zeros = 0;                                          \
        for (int64_t i = 0; i < n; i++) {                                                            \
            double v = LOAD(x, i);                                                                   \
            int is_nan = v != v;                                                                     \
            nan += is_nan;                                                                           \
            posinf += v == INFINITY;                                                                 \
            neginf += v == -INFINITY;                                                                \
            zeros += v == 0;                                                                         \
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
        acc->zeros += zeros;                                                                         \
    }

static void finish(const acc_t *acc, int64_t numel, double *out) {
    out[0] = acc->nan == numel ? NAN : acc->low;
    out[1] = acc->nan == numel ? NAN : acc->high;
    out[2] = acc->sum;
    out[3] = acc->squares;
    out[4] = (double)acc->nan;
    out[5] = (double)acc->posinf;
    out[6] = (double)acc->neginf;
    out[7] = (double)acc->zeros;
}

static int needs_care(const acc_t *acc) {
    int underflow = acc->squares < 1e-30 && (acc->low < 0 || acc->high > 0);
    return !isfinite(acc->sum) || !isfinite(acc->squares) || underflow;
}

typedef void (*run_fn)(const void *x, void *dst, int64_t n, acc_t *acc, rows_t *rows);

static const acc_t ACC_INIT = {INFINITY, -INFINITY, 0.0, 0.0, 0, 0, 0, 0, 0};

#ifdef _OPENMP
static void merge(acc_t *into, const acc_t *part) {
    if (part->low < into->low) into->low = part->low;
    if (part->high > into->high) into->high = part->high;
    into->sum += part->sum;
    into->squares += part->squares;
    into->nan += part->nan;
    into->posinf += part->posinf;
    into->neginf += part->neginf;
    into->zeros += part->zeros;
    into->hash += part->hash;
}
#endif

/* RUN over n contiguous elements (and dst, when copying), one chunk per thread of torch's pool;
 * key0 and step: the fingerprint's key of element 0 and its step (see hash_fn). */
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
            rows_t rows = row_of_run(key0 + (uint64_t)begin * step, step);
            if (end > begin) run(src + begin * element_size, dst ? dst + begin * element_size : NULL, end - begin, &parts[t], &rows);
            if (t == 0) used = k;
        }
        for (int t = 0; t < used; t++) merge(&total, &parts[t]);
        return total;
    }
#else
    (void)element_size;
    (void)threads;
#endif
    rows_t rows = row_of_run(key0, step);
    run(src, dst, n, &total, &rows);
    return total;
}

/* Calls run on every contiguous run of a tensor of ndim >= 2 walk dimensions whose outermost index
 * lies in [first, last): a run is as much contiguous memory as the innermost dimensions make together
 * (each one's stride the extent of the one inside it), an odometer over the dimensions outside them.
 * With positions (the fingerprint's walk, whose dimensions merge only where the logical order
 * continues too: a transposed view's rows are 64 elements), the run's rows cursor gives each row its
 * key, so a short row costs no call of its own. */
static void walk_runs(run_fn run, const char *data, size_t element_size, int ndim, const int64_t *sizes,
                      const int64_t *strides, const int64_t *positions, int64_t first, int64_t last, acc_t *acc) {
    if (first >= last) return;
    int inner = ndim - 1; /* the run's outermost dimension */
    while (inner > 0 && strides[inner - 1] == sizes[inner] * strides[inner]) inner--;
    const uint64_t words = element_size == 8 ? 2 : 1; /* words an element: see hash_fn */
    int64_t length = inner == 0 ? last - first : sizes[inner];
    for (int d = inner + 1; d < ndim; d++) length *= sizes[d];
    rows_t rows;
    rows.row = sizes[ndim - 1];
    rows.step = positions ? (uint64_t)positions[ndim - 1] * words * GAMMA : 0;
    rows.dims = ndim - 1 - inner;
    for (int j = 0; j < rows.dims; j++) {
        rows.sizes[j] = sizes[inner + j];
        rows.steps[j] = positions ? (uint64_t)positions[inner + j] * words * GAMMA : 0;
    }
    int64_t index[MAX_DIMS] = {0};
    index[0] = first;
    for (;;) {
        int64_t offset = 0;
        uint64_t position = 0;
        for (int d = 0; d <= inner; d++) offset += index[d] * strides[d];
        if (positions)
            for (int d = 0; d <= inner; d++) position += (uint64_t)index[d] * (uint64_t)positions[d];
        rows.at = 0;
        rows.key = (position * words + 1) * GAMMA;
        for (int j = 0; j < rows.dims; j++) rows.index[j] = index[inner + j];
        run(data + offset * (int64_t)element_size, NULL, length, acc, &rows);
        if (inner == 0) break;
        int d = inner - 1;
        while (d > 0 && ++index[d] == sizes[d]) index[d--] = 0;
        if (d == 0 && ++index[0] == last) break;
    }
}

/* walk_runs over the whole tensor. With the fingerprint (positions not NULL), which costs more
 * arithmetic than memory, a big tensor's outermost dimension is cut into one range per thread of
 * torch's pool, merged in thread order; the statistics alone walk on one thread, as before. */
static acc_t walk_split(run_fn run, const char *data, size_t element_size, int ndim, const int64_t *sizes,
                        const int64_t *strides, const int64_t *positions, int64_t numel, int threads) {
    acc_t total = ACC_INIT;
#ifdef _OPENMP
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (positions && numel >= PARALLEL_MIN && threads > 1 && sizes[0] > 1 && !omp_in_parallel()) {
        acc_t parts[MAX_THREADS];
        int used = 1;
#pragma omp parallel num_threads(threads)
        {
            int t = omp_get_thread_num(), k = omp_get_num_threads();
            int64_t chunk = (sizes[0] + k - 1) / k;
            int64_t first = t * chunk < sizes[0] ? t * chunk : sizes[0];
            int64_t last = first + chunk < sizes[0] ? first + chunk : sizes[0];
            parts[t] = ACC_INIT;
            walk_runs(run, data, element_size, ndim, sizes, strides, positions, first, last, &parts[t]);
            if (t == 0) used = k;
        }
        for (int t = 0; t < used; t++) merge(&total, &parts[t]);
        return total;
    }
#else
    (void)numel;
    (void)threads;
#endif
    walk_runs(run, data, element_size, ndim, sizes, strides, positions, 0, sizes[0], &total);
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
        const uint64_t words = sizeof(TYPE) == 8 ? 2 : 1; /* words an element: see hash_fn */      \
        uint64_t step = positions ? (uint64_t)positions[0] * words * GAMMA : 0;                      \
        acc_t acc = ACC_INIT; /* empty: nothing walked (an odometer over a size of 0 never ends) */  \
        if (numel > 0 && ndim == 1) {                                                                \
            acc = run_split(FAST_NAME, data, NULL, numel, sizeof(TYPE), threads, GAMMA, step);       \
        } else if (numel > 0) {                                                                      \
            acc = walk_split(FAST_NAME, data, sizeof(TYPE), ndim, sizes, strides, positions, numel, threads); \
        }                                                                                            \
        if (positions) *hash = mix64(acc.hash + (uint64_t)numel * words * GAMMA);                    \
        int careful = out && needs_care(&acc);                                                       \
        if (careful && ndim == 1) {                                                                  \
            acc = run_split(CAREFUL_NAME, data, NULL, numel, sizeof(TYPE), threads, 0, 0);           \
        } else if (careful) {                                                                        \
            acc = walk_split(CAREFUL_NAME, data, sizeof(TYPE), ndim, sizes, strides, NULL, numel, threads); \
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

FAST_RUN(fast_f32, load_f32, float, float, 0, 0)
FAST_RUN(fast_bf16, load_bf16, float, uint16_t, 0, 0)
FAST_RUN(fast_f64, load_f64, double, double, 0, 0)
FAST_RUN(fast_hash_f32, load_f32, float, float, 0, 1)
FAST_RUN(fast_hash_bf16, load_bf16, float, uint16_t, 0, 1)
FAST_RUN(fast_hash_f64, load_f64, double, double, 0, 1)
FAST_RUN(copy_f32, load_f32, float, float, 1, 0)
FAST_RUN(copy_bf16, load_bf16, float, uint16_t, 1, 0)
FAST_RUN(copy_f64, load_f64, double, double, 1, 0)
CAREFUL_RUN(careful_f32, load_f32)
CAREFUL_RUN(careful_bf16, load_bf16)
CAREFUL_RUN(careful_f64, load_f64)
HASH_RUN(hash_u8, 1)
HASH_RUN(hash_u16, 2)
HASH_RUN(hash_u32, 4)
HASH_RUN(hash_u64, 8)
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

/* The same entry points for integer dtypes (suffixes i64, i32, i16, i8, u8): one pass in double,
 * which never needs the careful one (no NaN or Inf; squares of nonzero integers do not underflow). */
#define INTEGER_KERNELS(SUFFIX, TYPE)                                                                \
    FAST_RUN(fast_##SUFFIX, load_##SUFFIX, double, TYPE, 0, 0)                                      \
    FAST_RUN(fast_hash_##SUFFIX, load_##SUFFIX, double, TYPE, 0, 1)                                 \
    FAST_RUN(copy_##SUFFIX, load_##SUFFIX, double, TYPE, 1, 0)                                      \
    WALK_STATS(walk_stats_##SUFFIX, fast_##SUFFIX, fast_##SUFFIX, TYPE)                             \
    WALK_STATS(walk_stats_hash_##SUFFIX, fast_hash_##SUFFIX, fast_##SUFFIX, TYPE)                   \
    STATS(td_stats_##SUFFIX, walk_stats_##SUFFIX)                                                   \
    STATS_HASH(td_stats_hash_##SUFFIX, walk_stats_hash_##SUFFIX)                                    \
    COPY_STATS(td_copy_stats_##SUFFIX, copy_##SUFFIX, fast_##SUFFIX, TYPE)

INTEGER_KERNELS(i64, int64_t)
INTEGER_KERNELS(i32, int32_t)
INTEGER_KERNELS(i16, int16_t)
INTEGER_KERNELS(i8, int8_t)
INTEGER_KERNELS(u8, uint8_t)

/* td_stats_many(count, entries, threads): td_stats_<dtype> of count non-empty contiguous tensors in
 * one call (a call through ctypes costs the host more than a small tensor's pass: the flight
 * recorder reduces a step's parameters and gradients this way). entries: 4 int64 per tensor, its
 * data address, its dtype (0 float32, 1 bfloat16, 2 float64), its element count and the address of
 * its out[]; each out[] is what td_stats_<dtype> writes for that tensor alone. Returns how many
 * tensors took the careful loop. */
int64_t td_stats_many(int64_t count, const int64_t *entries, int threads) {
    static const int64_t one[1] = {1};
    int64_t careful = 0;
    for (int64_t i = 0; i < count; i++) {
        const int64_t *entry = entries + 4 * i;
        const void *data = (const void *)(intptr_t)entry[0];
        const int64_t sizes[1] = {entry[2]};
        double *out = (double *)(intptr_t)entry[3];
        switch (entry[1]) {
        case 0: careful += walk_f32(data, 1, sizes, one, NULL, out, NULL, threads); break;
        case 1: careful += walk_bf16(data, 1, sizes, one, NULL, out, NULL, threads); break;
        case 2: careful += walk_f64(data, 1, sizes, one, NULL, out, NULL, threads); break;
        default: break;
        }
    }
    return careful;
}

/* td_finish_sums(count, refs, sums, slots, ndim, shape, numel, values, counts, validity, nulls): the
 * statistics of count records from sums taken before, as stats_from_sums (torchdebug/stats/_schema.py)
 * finishes one sums vector, written as the columns of the record batch's statistics struct (the
 * native path's, store/_slot_columns.py): no pass in Python a field. Record i takes row refs[i] of
 * sums (COLUMNS, SUMS_WIDTH doubles a row), none where refs[i] < 0. A row's element count is the product
 * of its sizes: ndim[] of the slots rows, their sizes concatenated in shape[] (none: one element);
 * numel[] is room for slots of them. values: 4 rows of count doubles (min, max, mean, norm), counts:
 * 4 rows of count int64 (nan, posinf, neginf, zeros), zero for a record without sums. validity: 3
 * Arrow bitmaps of (count + 7) / 8 bytes (bit i in byte i / 8, least significant first), set for the
 * records with sums (the struct and its counts), for those with a non-NaN element too (min, max,
 * norm), and for those whose mean is not NaN as well (mean); nulls[3]: the records each leaves out.
 * The mean is the sum over the non-NaN elements and the norm the square root of the squares, in
 * IEEE double as Python's / and math.sqrt give them: the same bits. */
#define VALUE_FIELDS 4
void td_finish_sums(int64_t count, const int64_t *refs, const double *sums, int64_t slots, const int8_t *ndim,
                    const int64_t *shape, int64_t *numel, double *values, int64_t *counts, uint8_t *validity,
                    int64_t *nulls) {
    const int64_t width = SUMS_WIDTH, bytes = (count + 7) / 8;
    const int64_t *sizes = shape;
    for (int64_t slot = 0; slot < slots; slot++) {
        int64_t elements = 1;
        for (int d = 0; d < ndim[slot]; d++) elements *= *sizes++;
        numel[slot] = elements;
    }
    uint8_t *present = validity, *some = validity + bytes, *mean_valid = validity + 2 * bytes;
    memset(validity, 0, (size_t)(3 * bytes));
    nulls[0] = nulls[1] = nulls[2] = 0;
    for (int64_t i = 0; i < count; i++) {
        const int64_t ref = refs[i];
        const uint8_t bit = (uint8_t)(1u << (i & 7));
        if (ref < 0) {
            for (int f = 0; f < VALUE_FIELDS; f++) values[f * count + i] = 0.0;
            for (int f = 0; f < SUMS_WIDTH - VALUE_FIELDS; f++) counts[f * count + i] = 0;
            nulls[0]++, nulls[1]++, nulls[2]++;
            continue;
        }
        const double *row = sums + ref * width;
        int64_t tally[SUMS_WIDTH - VALUE_FIELDS];
        for (int f = 0; f < SUMS_WIDTH - VALUE_FIELDS; f++) {
            tally[f] = (int64_t)row[VALUE_FIELDS + f];
            counts[f * count + i] = tally[f];
        }
        const int64_t valid = numel[ref] - tally[0]; /* the non-NaN elements (nan is the first count) */
        const double mean = row[2] / (double)valid;
        values[i] = row[0];
        values[count + i] = row[1];
        values[2 * count + i] = mean;
        values[3 * count + i] = sqrt(row[3]);
        present[i >> 3] |= bit;
        if (valid == 0) {
            nulls[1]++, nulls[2]++;
            continue;
        }
        some[i >> 3] |= bit;
        if (mean != mean) {
            nulls[2]++;
            continue;
        }
        mean_valid[i >> 3] |= bit;
    }
}
