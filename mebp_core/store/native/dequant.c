/* Group-wise affine dequantization, w = q * scale + bias, one pass from packed bytes to the
 * output dtype. Arithmetic matches the torch path bit for bit: a float32 multiply, then a
 * float32 add (compiled with -ffp-contract=off, so never a fused multiply-add), then
 * round-to-nearest-even to bfloat16. The *_bf16_f32 functions write bfloat16's values as
 * float32 (for float32 matmuls on a model held in bfloat16: the same values, wider).
 *
 * int4 groups run on explicit vectors where the CPU has them: 16 packed bytes at a time on
 * AVX-512 (groups of a multiple of 32), 8 on AVX2 (of 16), low nibble first; other groups
 * run the scalar loop. bfloat16 is rounded by the
 * CPU's own instruction where it has AVX-512 BF16 (2x the integer rounding's speed here);
 * its flush of denormals never applies, as every nonzero q * scale + bias of float16 factors
 * is at least 2^-24 in magnitude. Measured: BENCHMARKS.md, "The dequantization kernel on
 * explicit vectors".
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
typedef __m512 vfloat;
/* the 32 values of 16 packed bytes, in order, as two vectors */
static inline void int4_values(const uint8_t *d, vfloat s, vfloat b, vfloat *first,
                               vfloat *second) {
  const __m512i low_first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22,
                                              7, 23);
  const __m512i high_first = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29,
                                               14, 30, 15, 31);
  __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)d));
  __m512i lo = _mm512_and_si512(bytes, _mm512_set1_epi32(15));
  __m512i hi = _mm512_srli_epi32(bytes, 4);
  __m512 q0 = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(lo, low_first, hi));
  __m512 q1 = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(lo, high_first, hi));
  *first = _mm512_add_ps(_mm512_mul_ps(q0, s), b);
  *second = _mm512_add_ps(_mm512_mul_ps(q1, s), b);
}
static inline void store_f32(float *o, vfloat x, vfloat y) {
  _mm512_storeu_ps(o, x);
  _mm512_storeu_ps(o + 16, y);
}
static inline __m512i bf16_bits(vfloat f) { /* to_bf16, 16 lanes, in the low halves */
  __m512i u = _mm512_castps_si512(f);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_srli_epi32(u, 16);
}
static inline void store_bf16_f32(float *o, vfloat x, vfloat y) {
  store_f32(o, _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(x), 16)),
            _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(y), 16)));
}
#if defined(__AVX512BF16__)
static inline void store_bf16(uint16_t *o, vfloat x, vfloat y) {
  _mm512_storeu_si512((void *)o, (__m512i)_mm512_cvtne2ps_pbh(y, x));
}
#else
static inline void store_bf16(uint16_t *o, vfloat x, vfloat y) {
  __m512i packed = _mm512_packus_epi32(bf16_bits(x), bf16_bits(y)); /* per 128-bit lane */
  _mm512_storeu_si512((void *)o, _mm512_permutexvar_epi64(
                                     _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), packed));
}
#endif
#define SET1 _mm512_set1_ps
#elif VECTOR_BYTES == 8
typedef __m256 vfloat;
static inline void int4_values(const uint8_t *d, vfloat s, vfloat b, vfloat *first,
                               vfloat *second) {
  __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)d));
  __m256i lo = _mm256_and_si256(bytes, _mm256_set1_epi32(15));
  __m256i hi = _mm256_srli_epi32(bytes, 4);
  __m256i a = _mm256_unpacklo_epi32(lo, hi), c = _mm256_unpackhi_epi32(lo, hi);
  __m256 q0 = _mm256_cvtepi32_ps(_mm256_permute2x128_si256(a, c, 0x20));
  __m256 q1 = _mm256_cvtepi32_ps(_mm256_permute2x128_si256(a, c, 0x31));
  *first = _mm256_add_ps(_mm256_mul_ps(q0, s), b);
  *second = _mm256_add_ps(_mm256_mul_ps(q1, s), b);
}
static inline void store_f32(float *o, vfloat x, vfloat y) {
  _mm256_storeu_ps(o, x);
  _mm256_storeu_ps(o + 8, y);
}
static inline __m256i bf16_bits(vfloat f) {
  __m256i u = _mm256_castps_si256(f);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  u = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  return _mm256_srli_epi32(u, 16);
}
static inline void store_bf16(uint16_t *o, vfloat x, vfloat y) {
  __m256i packed = _mm256_packus_epi32(bf16_bits(x), bf16_bits(y)); /* per 128-bit lane */
  _mm256_storeu_si256((__m256i *)o, _mm256_permute4x64_epi64(packed, 0xD8));
}
static inline void store_bf16_f32(float *o, vfloat x, vfloat y) {
  store_f32(o, _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(x), 16)),
            _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(y), 16)));
}
#define SET1 _mm256_set1_ps
#endif

#if VECTOR_BYTES
#define INT4_VECTOR_GROUP(STORE)                                                            \
  if (half % VECTOR_BYTES == 0) {                                                           \
    const vfloat vs = SET1(s), vb = SET1(b);                                                \
    for (int64_t j = 0; j < half; j += VECTOR_BYTES) {                                      \
      vfloat x, y;                                                                          \
      int4_values(d + j, vs, vb, &x, &y);                                                   \
      STORE(o + 2 * j, x, y);                                                               \
    }                                                                                       \
    continue;                                                                               \
  }
#else
#define INT4_VECTOR_GROUP(STORE)
#endif

#define DEFINE_INT4(NAME, OUT_T, CONVERT, STORE)                                            \
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
        INT4_VECTOR_GROUP(STORE)                                                            \
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
DEFINE_INT4(dequant_int4_f32, float, AS_FLOAT, store_f32)
DEFINE_INT4(dequant_int4_bf16, uint16_t, to_bf16, store_bf16)
DEFINE_INT8(dequant_int8_f32, float, AS_FLOAT)
DEFINE_INT8(dequant_int8_bf16, uint16_t, to_bf16)
DEFINE_INT4(dequant_int4_bf16_f32, float, bf16_value, store_bf16_f32)
DEFINE_INT8(dequant_int8_bf16_f32, float, bf16_value)

/* Which path this build takes (for the tests): the packed bytes of a vector step, 0 for the
 * scalar loop, and whether bfloat16 is rounded by the CPU's own instruction. */
int dequant_vector_bytes(void) { return VECTOR_BYTES; }

int dequant_bf16_instruction(void) {
#if VECTOR_BYTES == 16 && defined(__AVX512BF16__)
  return 1;
#else
  return 0;
#endif
}
