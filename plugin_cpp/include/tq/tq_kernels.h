/* tq_kernels.h: the plain C ABI of the tq_trtllm CUDA kernel library.
 *
 * Device pointers, sizes and a cudaStream_t in; a tq_status out. No torch and no TensorRT here:
 * the TensorRT plugin, the Python package (ctypes) and the C++ examples all call these functions.
 * The packed layout is docs/FORMAT.md (format version TQ_FORMAT_VERSION).
 */
#ifndef TQ_KERNELS_H
#define TQ_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TQ_FORMAT_VERSION 1
#define TQ_MAX_GROUPS 2
#define TQ_MAX_HEAD_DIM 128 /* the kernels support head_dim 64 and 128 */

typedef struct CUstream_st* tq_stream; /* the same type as cudaStream_t */

typedef enum tq_status {
  TQ_OK = 0,
  TQ_ERR_NULL_POINTER = 1,
  TQ_ERR_UNSUPPORTED_HEAD_DIM = 2,
  TQ_ERR_UNSUPPORTED_BITS = 3,
  TQ_ERR_BAD_LENGTH = 4,   /* a length beyond the block table, or out of range */
  TQ_ERR_MISALIGNED = 5,
  TQ_ERR_INVALID_ARGUMENT = 6,
  TQ_ERR_WORKSPACE = 7,    /* workspace missing or too small */
  TQ_ERR_CUDA = 8,
  TQ_ERR_FORMAT_VERSION = 9
} tq_status;

typedef enum tq_dtype { TQ_FP16 = 0, TQ_BF16 = 1 } tq_dtype;

/* The message of the last failed call on this host thread ("" if none). */
const char* tq_last_error(void);
/* TQ_OK if the library reads `version`, else TQ_ERR_FORMAT_VERSION with a message. */
tq_status tq_check_format_version(int32_t version);

/* How one of K or V is encoded (docs/FORMAT.md, sections 1-4), for one layer. */
typedef struct tq_codec {
  int32_t head_dim;                     /* 64 or 128 */
  int32_t num_groups;                   /* 1, or 2 for fractional widths */
  int32_t group_dim[TQ_MAX_GROUPS];     /* n_g, sums to head_dim */
  int32_t group_bits[TQ_MAX_GROUPS];    /* b_g in 1..4 */
  float codebook[TQ_MAX_GROUPS][16];    /* ascending centroids, first 2^b_g used */
  uint32_t seed;                        /* rotation signs, FORMAT.md section 4 */
  const int32_t* perm;  /* device [num_kv_heads][head_dim] channel order, or NULL = identity */
  const float* mean;    /* device [num_kv_heads][head_dim], or NULL = zeros */
  const float* scale;   /* device [num_kv_heads][head_dim], or NULL = ones */
} tq_codec;

/* One layer's paged cache (FORMAT.md, section 6). */
typedef struct tq_paged_cache {
  void* k_pool;
  void* v_pool;
  int64_t k_chunk_bytes;
  int64_t v_chunk_bytes;
  const int32_t* block_table;  /* device [batch][2][max_blocks] chunk indices */
  int32_t max_blocks;
  int32_t tokens_per_block;    /* multiple of 16 */
  int32_t num_kv_heads;
  tq_codec key;
  tq_codec value;
} tq_paged_cache;

/* Bytes of one page of `codec` holding `tokens_per_block` tokens. */
int64_t tq_page_bytes(const tq_codec* codec, int32_t tokens_per_block);

/* Quantize and write `num_tokens` new K and V rows (already rotary-embedded).
 * k, v: [num_tokens][num_kv_heads][head_dim] with row stride `token_stride` elements.
 * Token i goes to sequence seq_idx[i], position pos[i] (device int32 arrays).
 * Serves one decode step (one token per sequence) and the bulk write after a prefill. */
tq_status tq_quantize_append(const tq_paged_cache* cache, const void* k, const void* v,
                             int64_t token_stride, tq_dtype dtype, const int32_t* seq_idx,
                             const int32_t* pos, int32_t num_tokens, int32_t batch,
                             tq_stream stream);

/* Attention of q_len new query tokens per sequence against the sequence's whole packed history,
 * the new tokens' own keys included (they were appended first). Query token j of sequence b sits
 * at position kv_lens[b] - q_len + j and attends to positions <= its own (causal).
 * q, out: [batch][q_len][num_q_heads][head_dim] (contiguous). kv_lens: device [batch].
 * max_kv_len bounds every kv_lens[b] (host value; it sizes the split-KV grid).
 * decode: q_len 1..8; prefill: any q_len (the chunk), same contract. */
size_t tq_attention_workspace_bytes(int32_t batch, int32_t q_len, int32_t num_q_heads,
                                    int32_t head_dim, int32_t max_kv_len);
tq_status tq_decode_attention(const tq_paged_cache* cache, const void* q, void* out,
                              tq_dtype dtype, const int32_t* kv_lens, int32_t max_kv_len,
                              int32_t batch, int32_t q_len, int32_t num_q_heads,
                              float softmax_scale, void* workspace, size_t workspace_bytes,
                              tq_stream stream);
tq_status tq_prefill_attention(const tq_paged_cache* cache, const void* q, void* out,
                               tq_dtype dtype, const int32_t* kv_lens, int32_t max_kv_len,
                               int32_t batch, int32_t q_len, int32_t num_q_heads,
                               float softmax_scale, void* workspace, size_t workspace_bytes,
                               tq_stream stream);

/* Dequantize positions [start, start + len) of sequence `seq` into k_out, v_out:
 * [len][num_kv_heads][head_dim] in `dtype`. For tests and export. */
tq_status tq_dequantize(const tq_paged_cache* cache, int32_t seq, int32_t start, int32_t len,
                        void* k_out, void* v_out, tq_dtype dtype, tq_stream stream);

#ifdef __cplusplus
}
#endif
#endif /* TQ_KERNELS_H */
