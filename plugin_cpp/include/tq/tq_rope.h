/* tq_rope.h: rotary position embedding for the QuantizedAttention plugin.
 *
 * Kept apart from tq_kernels.h (the kernel library's ABI) so the two evolve independently; same
 * conventions: device pointers in, a tq_status out, no torch and no TensorRT.
 */
#ifndef TQ_ROPE_H
#define TQ_ROPE_H

#include "tq/tq_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tq_rope_scaling {
  TQ_ROPE_SCALING_NONE = 0,
  TQ_ROPE_SCALING_LINEAR = 1, /* positions divided by `factor` */
  TQ_ROPE_SCALING_LLAMA3 = 2  /* Llama 3.1 frequency-dependent scaling */
} tq_rope_scaling;

typedef struct tq_rope_params {
  float base;                     /* theta, e.g. 10000 or 500000 */
  int32_t scaling;                /* a tq_rope_scaling */
  float factor;                   /* LINEAR and LLAMA3 */
  float low_freq_factor;          /* LLAMA3 */
  float high_freq_factor;         /* LLAMA3 */
  int32_t original_max_positions; /* LLAMA3 */
} tq_rope_params;

/* Splits the fused QKV projection and rotates q and k (GPT-NeoX / Llama half split: channel i
 * pairs with channel i + head_dim / 2), angles computed in double precision.
 *   qkv:    [num_tokens] rows of (num_q_heads + 2 * num_kv_heads) * head_dim, row stride
 *           `qkv_stride` elements: q heads, then k heads, then v heads.
 *   pos:    device int32 [num_tokens], the position of each token.
 *   q_out:  [num_tokens][num_q_heads][head_dim], rotated.
 *   kv_out: [num_tokens][2][num_kv_heads][head_dim]: rotated k, then v unchanged, so that k and v
 *           share one token stride (2 * num_kv_heads * head_dim), as tq_quantize_append wants. */
tq_status tq_rope_split_qkv(const void* qkv, int64_t qkv_stride, tq_dtype dtype, const int32_t* pos,
                            int32_t num_tokens, int32_t num_q_heads, int32_t num_kv_heads,
                            int32_t head_dim, const tq_rope_params* rope, void* q_out,
                            void* kv_out, tq_stream stream);

#ifdef __cplusplus
}
#endif
#endif /* TQ_ROPE_H */
