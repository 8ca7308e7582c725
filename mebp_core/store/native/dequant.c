/* Group-wise affine dequantization, w = q * scale + bias, one pass from packed bytes to the
 * output dtype. Arithmetic matches the torch path bit for bit: a float32 multiply, then a
 * float32 add (compiled with -ffp-contract=off, so never a fused multiply-add), then
 * round-to-nearest-even to bfloat16.
 *
 * Rows are split over OpenMP threads, as many as torch's ops use (threads, from the caller).
 * Linked against libgomp.so.1, the copy torch loaded, the regions run on torch's own pool,
 * whose workers spin between ops: beside them a single-threaded kernel ran 3-4x slower than
 * alone. Like torch's own regions they stall when another process holds a core, where the
 * engine belongs at one thread. Measurements: BENCHMARKS.md, "Decompression on torch's own
 * threads". Outputs under PARALLEL_MIN elements stay on one thread (2-3 us a call at stake). */
#include <stdint.h>
#include <string.h>

#define PARALLEL_MIN 65536

static inline uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

#define DEFINE_INT4(NAME, OUT_T, CONVERT)                                                   \
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
DEFINE_INT4(dequant_int4_f32, float, AS_FLOAT)
DEFINE_INT4(dequant_int4_bf16, uint16_t, to_bf16)
DEFINE_INT8(dequant_int8_f32, float, AS_FLOAT)
DEFINE_INT8(dequant_int8_bf16, uint16_t, to_bf16)
