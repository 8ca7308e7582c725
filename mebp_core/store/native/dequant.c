/* Group-wise affine dequantization, w = q * scale + bias, one pass from packed bytes to the
 * output dtype. Arithmetic matches the torch path bit for bit: a float32 multiply, then a
 * float32 add (compiled with -ffp-contract=off, so never a fused multiply-add), then
 * round-to-nearest-even to bfloat16.
 *
 * Rows are split over OpenMP threads. The library is linked against libgomp.so.1, which
 * resolves to the copy torch already loaded, so these regions run on torch's own thread pool,
 * as many threads as torch's ops use (threads, from the caller):
 * its workers spin between torch's ops, and beside them a single-threaded kernel ran at
 * 0.8 ns a parameter inside a training step, against 0.2-0.3 with the workers told not to
 * spin (OMP_WAIT_POLICY=passive, which slowed torch's own ops more). Right after a matmul,
 * two threads took 17 us for 131k elements against 28 on one, 94 against 182 for 1M; under
 * PARALLEL_MIN elements they save 2-3 us a call, and the rows stay on one thread. */
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
