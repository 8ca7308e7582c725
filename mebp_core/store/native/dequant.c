/* Group-wise affine dequantization, w = q * scale + bias, one pass from packed bytes to the
 * output dtype. Arithmetic matches the torch path bit for bit: a float32 multiply, then a
 * float32 add (compiled with -ffp-contract=off, so never a fused multiply-add), then
 * round-to-nearest-even to bfloat16. The *_bf16_f32 functions write bfloat16's values as
 * float32 (for float32 matmuls on a model held in bfloat16: the same values, wider).
 *
 * int4 groups run on explicit vectors where the CPU has them: 16 packed bytes at a time on
 * AVX-512 (groups of a multiple of 32), 8 on AVX2 (of 16), low nibble first; other groups
 * run the scalar loop. A 16-bit output (and bfloat16's values in float32) is looked up: each
 * group's 16 possible values are computed and rounded once, as the scalar loop would, then
 * each q takes its own by a permute (a byte shuffle for bfloat16 on AVX2). In bfloat16 that
 * took 0.87-0.92x the time of computing every value on AVX-512 (an 8 MB tile now written at
 * about 32 GB/s) and 0.71-0.73x on AVX2 (a build without AVX-512, on the same Xeon). Plain
 * float32 outputs are computed: the lookup was no faster there on AVX-512, and slower on
 * AVX2. Every build rounds by the integer arithmetic of to_bf16 (AVX-512 BF16's instruction,
 * which would round 16 values a group, bought nothing and flushes denormals), so every build
 * gives the same bits. Measured: BENCHMARKS.md, "The dequantization kernel on explicit
 * vectors" and "A group's values looked up".
 *
 * Rows are split over OpenMP threads, as many as torch's ops use (threads, from the caller).
 * Linked against libgomp.so.1, the copy torch loaded, the regions run on torch's own pool,
 * whose workers spin between ops: beside them a single-threaded kernel ran 3-4x slower than
 * alone. Like torch's own regions they stall when another process holds a core, where the
 * engine belongs at one thread. Measurements: BENCHMARKS.md, "Decompression on torch's own
 * threads". Outputs under PARALLEL_MIN elements stay on one thread (2-3 us a call at stake). */
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define VECTOR_BYTES 16
#elif defined(__AVX2__)
#include <immintrin.h>
#define VECTOR_BYTES 8
#else
#define VECTOR_BYTES 0
#endif

#define PARALLEL_MIN 65536

static inline uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float bf16_value(float f) { /* f rounded to bfloat16, as a float */
  uint32_t u = (uint32_t)to_bf16(f) << 16;
  float rounded;
  memcpy(&rounded, &u, sizeof rounded);
  return rounded;
}

#if VECTOR_BYTES == 16
/* What a vector step needs of a group (prepare_*), and the step itself (fill_*): 16 packed
 * bytes into 32 outputs. 16-bit outputs and bfloat16's values in float32 look their values
 * up in the group's 16 (q = 0..15), computed and rounded once as the scalar loop does; plain
 * float32 keeps the group's factors and computes each value. */
static inline __m512 group_values(float s, float b) {
  const __m512 q = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return _mm512_add_ps(_mm512_mul_ps(q, _mm512_set1_ps(s)), _mm512_set1_ps(b));
}
static inline __m512i bf16_bits(__m512 f) { /* to_bf16, 16 lanes, in the low halves */
  __m512i u = _mm512_castps_si512(f);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_srli_epi32(u, 16);
}
typedef struct { __m512 scale, bias; } group_f32;
typedef __m512 group_bf16_f32; /* the 16 values, rounded to bfloat16, as float32 */
typedef __m512i group_bf16;    /* the 16 values in the low 16 words */
static inline group_f32 prepare_f32(float s, float b) {
  group_f32 g = {_mm512_set1_ps(s), _mm512_set1_ps(b)};
  return g;
}
static inline group_bf16_f32 prepare_bf16_f32(float s, float b) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(group_values(s, b)), 16));
}
static inline group_bf16 prepare_bf16(float s, float b) {
  return _mm512_zextsi256_si512(_mm512_cvtepi32_epi16(bf16_bits(group_values(s, b))));
}
/* the 32 q of 16 packed bytes, in order (low nibble first), as two vectors of 16 dwords */
static inline void int4_dwords(const uint8_t *d, __m512i *first, __m512i *second) {
  const __m512i low_first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22,
                                              7, 23);
  const __m512i high_first = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29,
                                               14, 30, 15, 31);
  __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)d));
  __m512i lo = _mm512_and_si512(bytes, _mm512_set1_epi32(15));
  __m512i hi = _mm512_srli_epi32(bytes, 4);
  *first = _mm512_permutex2var_epi32(lo, low_first, hi);
  *second = _mm512_permutex2var_epi32(lo, high_first, hi);
}
static inline void fill_f32(float *o, const uint8_t *d, group_f32 g) {
  __m512i q0, q1;
  int4_dwords(d, &q0, &q1);
  _mm512_storeu_ps(o, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(q0), g.scale), g.bias));
  _mm512_storeu_ps(o + 16,
                   _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(q1), g.scale), g.bias));
}
static inline void fill_bf16_f32(float *o, const uint8_t *d, group_bf16_f32 values) {
  __m512i q0, q1;
  int4_dwords(d, &q0, &q1);
  _mm512_storeu_ps(o, _mm512_permutexvar_ps(q0, values));
  _mm512_storeu_ps(o + 16, _mm512_permutexvar_ps(q1, values));
}
static inline void fill_bf16(uint16_t *o, const uint8_t *d, group_bf16 values) {
  /* byte b in a dword: low word b & 15, high word b >> 4, so 32 word indices in order */
  __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)d));
  __m512i q = _mm512_and_si512(_mm512_or_si512(b, _mm512_slli_epi32(b, 12)),
                               _mm512_set1_epi32(0x000F000F));
  _mm512_storeu_si512((void *)o, _mm512_permutexvar_epi16(q, values));
}
#elif VECTOR_BYTES == 8
/* As above, 8 packed bytes into 16 outputs a step; a group's 16 values as two vectors of 8
 * (q = 0..7 and 8..15). Plain float32 computes: two permutes and a blend cost more than a
 * convert, a multiply and an add here. */
static inline __m256i bf16_bits(__m256 f) {
  __m256i u = _mm256_castps_si256(f);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  u = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  return _mm256_srli_epi32(u, 16);
}
typedef struct { __m256 low, high; } sixteen_floats;
typedef struct { __m256 scale, bias; } group_f32;
typedef sixteen_floats group_bf16_f32; /* the 16 values, rounded to bfloat16, as float32 */
typedef struct { __m128i lo_bytes, hi_bytes; } group_bf16; /* the 16 values' two bytes */
static inline sixteen_floats group_values(float s, float b) {
  const __m256 vs = _mm256_set1_ps(s), vb = _mm256_set1_ps(b);
  sixteen_floats v = {
      _mm256_add_ps(_mm256_mul_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), vs), vb),
      _mm256_add_ps(_mm256_mul_ps(_mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15), vs), vb)};
  return v;
}
static inline group_f32 prepare_f32(float s, float b) {
  group_f32 g = {_mm256_set1_ps(s), _mm256_set1_ps(b)};
  return g;
}
static inline group_bf16_f32 prepare_bf16_f32(float s, float b) {
  sixteen_floats v = group_values(s, b);
  v.low = _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(v.low), 16));
  v.high = _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(v.high), 16));
  return v;
}
static inline group_bf16 prepare_bf16(float s, float b) {
  sixteen_floats v = group_values(s, b);
  /* 16 words in order (packus works per 128-bit lane), then low bytes and high bytes */
  __m256i words = _mm256_permute4x64_epi64(
      _mm256_packus_epi32(bf16_bits(v.low), bf16_bits(v.high)), 0xD8);
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                         0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  __m256i halves = _mm256_shuffle_epi8(words, split);
  __m128i first = _mm256_castsi256_si128(halves), second = _mm256_extracti128_si256(halves, 1);
  group_bf16 g = {_mm_unpacklo_epi64(first, second), _mm_unpackhi_epi64(first, second)};
  return g;
}
/* the 16 q of 8 packed bytes, in order (low nibble first), as two vectors of 8 dwords */
static inline void int4_dwords(const uint8_t *d, __m256i *first, __m256i *second) {
  __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)d));
  __m256i lo = _mm256_and_si256(bytes, _mm256_set1_epi32(15));
  __m256i hi = _mm256_srli_epi32(bytes, 4);
  __m256i a = _mm256_unpacklo_epi32(lo, hi), c = _mm256_unpackhi_epi32(lo, hi);
  *first = _mm256_permute2x128_si256(a, c, 0x20);
  *second = _mm256_permute2x128_si256(a, c, 0x31);
}
static inline void fill_f32(float *o, const uint8_t *d, group_f32 g) {
  __m256i q0, q1;
  int4_dwords(d, &q0, &q1);
  _mm256_storeu_ps(o, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q0), g.scale), g.bias));
  _mm256_storeu_ps(o + 8,
                   _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q1), g.scale), g.bias));
}
static inline __m256 look_up8(__m256i q, sixteen_floats values) { /* bit 3 picks the half */
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(values.low, q),
                          _mm256_permutevar8x32_ps(values.high, q),
                          _mm256_castsi256_ps(_mm256_slli_epi32(q, 28)));
}
static inline void fill_bf16_f32(float *o, const uint8_t *d, group_bf16_f32 values) {
  __m256i q0, q1;
  int4_dwords(d, &q0, &q1);
  _mm256_storeu_ps(o, look_up8(q0, values));
  _mm256_storeu_ps(o + 8, look_up8(q1, values));
}
static inline void fill_bf16(uint16_t *o, const uint8_t *d, group_bf16 g) {
  __m128i bytes = _mm_loadl_epi64((const __m128i *)d), m = _mm_set1_epi8(15);
  __m128i q = _mm_unpacklo_epi8(_mm_and_si128(bytes, m),
                                _mm_and_si128(_mm_srli_epi16(bytes, 4), m));
  __m128i lo = _mm_shuffle_epi8(g.lo_bytes, q), hi = _mm_shuffle_epi8(g.hi_bytes, q);
  _mm256_storeu_si256((__m256i *)o, _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi),
                                                     _mm_unpacklo_epi8(lo, hi)));
}
#endif

#if VECTOR_BYTES
#define INT4_VECTOR_GROUP(KIND)                                                             \
  if (half % VECTOR_BYTES == 0) {                                                           \
    const group_##KIND prepared = prepare_##KIND(s, b);                                     \
    for (int64_t j = 0; j < half; j += VECTOR_BYTES) fill_##KIND(o + 2 * j, d + j, prepared); \
    continue;                                                                               \
  }
#else
#define INT4_VECTOR_GROUP(KIND)
#endif

#define DEFINE_INT4(NAME, OUT_T, CONVERT, KIND)                                             \
  void NAME(const uint8_t *restrict data, const float *restrict scales,                    \
            const float *restrict biases, int64_t rows, int64_t k, int64_t group,          \
            OUT_T *restrict out, int threads) {                                             \
    const int64_t groups = k / group, half = group / 2;                                    \
    _Pragma("omp parallel for schedule(static) num_threads(threads)                       \
            if (rows * k >= PARALLEL_MIN)")                                                \
    for (int64_t r = 0; r < rows; r++)                                                      \
      for (int64_t g = 0; g < groups; g++) {                                                \
        const float s = scales[r * groups + g], b = biases[r * groups + g];                \
        const uint8_t *d = data + r * (k / 2) + g * half;                                  \
        OUT_T *o = out + r * k + g * group;                                                 \
        INT4_VECTOR_GROUP(KIND)                                                             \
        for (int64_t j = 0; j < half; j++) {                                                \
          o[2 * j] = CONVERT((float)(d[j] & 15) * s + b);                                   \
          o[2 * j + 1] = CONVERT((float)(d[j] >> 4) * s + b);                               \
        }                                                                                   \
      }                                                                                     \
  }

#define DEFINE_INT8(NAME, OUT_T, CONVERT)                                                   \
  void NAME(const uint8_t *restrict data, const float *restrict scales,                    \
            const float *restrict biases, int64_t rows, int64_t k, int64_t group,          \
            OUT_T *restrict out, int threads) {                                             \
    const int64_t groups = k / group;                                                       \
    _Pragma("omp parallel for schedule(static) num_threads(threads)                       \
            if (rows * k >= PARALLEL_MIN)")                                                \
    for (int64_t r = 0; r < rows; r++)                                                      \
      for (int64_t g = 0; g < groups; g++) {                                                \
        const float s = scales[r * groups + g], b = biases[r * groups + g];                \
        const uint8_t *d = data + r * k + g * group;                                        \
        OUT_T *o = out + r * k + g * group;                                                 \
        for (int64_t j = 0; j < group; j++) o[j] = CONVERT((float)d[j] * s + b);            \
      }                                                                                     \
  }

#define AS_FLOAT(x) (x)
DEFINE_INT4(dequant_int4_f32, float, AS_FLOAT, f32)
DEFINE_INT4(dequant_int4_bf16, uint16_t, to_bf16, bf16)
DEFINE_INT8(dequant_int8_f32, float, AS_FLOAT)
DEFINE_INT8(dequant_int8_bf16, uint16_t, to_bf16)
DEFINE_INT4(dequant_int4_bf16_f32, float, bf16_value, bf16_f32)
DEFINE_INT8(dequant_int8_bf16_f32, float, bf16_value)

/* Which path this build takes (for the tests): the packed bytes of a vector step, 0 for the
 * scalar loop. */
int dequant_vector_bytes(void) { return VECTOR_BYTES; }
