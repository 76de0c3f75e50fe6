/* tq_kernels.h: the plain C ABI of the tq_trtllm CUDA kernel library (libtq_kernels.so).
 *
 * Device pointers, sizes and a cudaStream_t in; a tq_status out. No torch and no TensorRT here:
 * the TensorRT plugin, the Python package (ctypes, tq_trtllm/kernels) and the C++ examples all call
 * these functions. The packed layout is docs/FORMAT.md (format version TQ_FORMAT_VERSION).
 *
 * Conventions
 * - Every function checks its host-side arguments first (null pointers, head_dim, widths, sizes,
 *   16-byte alignment of pools and chunk strides) and returns an error status with a message
 *   (tq_last_error) without launching anything.
 * - Values that live in device memory (kv_lens, seq_idx, pos, block-table entries) cannot be checked
 *   without a synchronization. The kernels never read or write outside the pools for them: a token
 *   whose position lies beyond the block table or whose block-table entry lies outside
 *   [0, num_chunks) is skipped (quantize-append writes nothing for it; attention treats it as absent),
 *   and kv_lens[b] is clamped to max_kv_len.
 * - All launches are asynchronous on `stream`; TQ_ERR_CUDA reports a failed launch.
 * - Thread safety: tq_last_error is per host thread; the functions keep no other state.
 */
#ifndef TQ_KERNELS_H
#define TQ_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TQ_FORMAT_VERSION 4
/* Version 3 only added widths; version 4 puts the codebooks' levels on an 8-bit grid, which the
   library applies to the codebooks it is given, of any version's tables. */
#define TQ_OLDEST_READABLE_FORMAT_VERSION 2
/* Whether this library reads packed format version v (tq_check_format_version explains a refusal). */
#define TQ_READS_FORMAT_VERSION(v) ((v) >= TQ_OLDEST_READABLE_FORMAT_VERSION && (v) <= TQ_FORMAT_VERSION)
#define TQ_MAX_BITS 5
#define TQ_MAX_GROUPS 2
#define TQ_MAX_HEAD_DIM 128 /* the kernels support head_dim 64 and 128 */
#define TQ_MAX_GQA_GROUP 8  /* query heads per KV head */
#define TQ_MAX_DECODE_Q_LEN 8 /* query tokens per sequence of a call with the fused append */
#define TQ_MAX_ROTARY_PAIRS 16 /* channel pairs of a key codec's rotary mean */

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

/* How one of K or V is encoded (docs/FORMAT.md, sections 1-4), for one layer; tq_codec_init
 * (below) fills it for a width. Integer widths: num_groups 1, group_dim {head_dim}, group_bits {b}.
 * Fractional widths w: num_groups 2, group_dim {head_dim/2, head_dim/2},
 * group_bits {ceil(w), floor(w)} (the outlier half first). */
typedef struct tq_codec {
  int32_t head_dim;                     /* 64 or 128 */
  int32_t num_groups;                   /* 1, or 2 for fractional widths */
  int32_t group_dim[TQ_MAX_GROUPS];     /* n_g, sums to head_dim */
  int32_t group_bits[TQ_MAX_GROUPS];    /* b_g in 1..TQ_MAX_BITS */
  float codebook[TQ_MAX_GROUPS][1 << TQ_MAX_BITS]; /* ascending centroids, first 2^b_g used */
  uint32_t seed;                        /* rotation signs, FORMAT.md section 4 */
  const int32_t* perm;  /* device [num_kv_heads][head_dim] channel order, or NULL = identity */
  const float* mean;    /* device [num_kv_heads][head_dim], or NULL = zeros */
  const float* scale;   /* device [num_kv_heads][head_dim] (positive), or NULL = ones */
  /* The rotary mean (FORMAT.md section 1.1), keys only (a value codec must have rotary_pairs 0):
   * rotary_pairs P in 0..TQ_MAX_ROTARY_PAIRS pairs per KV head; with P > 0 all three arrays are
   * required (4-byte aligned): pair i of head h is channels (a, a + head_dim / 2) with
   * a = rotary_channel[h][i] (distinct, in [0, head_dim / 2)), frequency rotary_freq[h][i] radians
   * per position, mean (rotary_mean[h][i][0], rotary_mean[h][i][1]). Quantize-append subtracts
   * R(pos) m, dequantize adds it back, attention adds q . R(pos) m to the logit of packed position
   * pos (fp16 products, as the keys'). */
  int32_t rotary_pairs;
  const int32_t* rotary_channel;
  const float* rotary_freq;
  const float* rotary_mean;
} tq_codec;

/* The groups of a width (FORMAT.md section 2), in one place for every caller: widths travel as
 * width_x2, twice the width (2 to 2 * TQ_MAX_BITS: 1, 1.5, ..., 5 bits per coordinate), so that
 * fractional widths stay integers. Host only: no GPU, no CUDA call.
 *
 * tq_codec_init fills *codec for one of K or V of a layer: head_dim (64 or 128), the groups of
 * width_x2 / 2 bits, the codebooks and `seed`; perm, mean, scale and the rotary arrays NULL and
 * rotary_pairs 0 (the caller sets those after). codebooks: every group's 2^b_g levels back to back
 * (group 0 first), each group's finite and strictly ascending, num_codebook_entries of them in all
 * (tq_codec_codebook_entries); or NULL with num_codebook_entries 0 for zeros (a codec for size
 * arithmetic only, which tq_page_bytes refuses). Errors, each with tq_last_error naming the value
 * and what is supported, and *codec left unchanged: codec NULL or codebooks NULL with entries
 * (TQ_ERR_NULL_POINTER), head_dim (TQ_ERR_UNSUPPORTED_HEAD_DIM), width_x2 (TQ_ERR_UNSUPPORTED_BITS),
 * num_codebook_entries or a codebook not finite and strictly ascending (TQ_ERR_INVALID_ARGUMENT). */
tq_status tq_codec_init(tq_codec* codec, int32_t head_dim, int32_t width_x2, uint32_t seed,
                        const float* codebooks, int32_t num_codebook_entries);

/* The codebook entries tq_codec_init takes for width_x2 at head_dim (the sum of 2^b_g over the
 * groups), or -1 with tq_last_error naming the bad head_dim or width_x2. */
int32_t tq_codec_codebook_entries(int32_t head_dim, int32_t width_x2);

/* Packed bytes of one token of one head for `codec`: the sum over its groups of n_g * b_g / 8 + 2
 * (codes and an fp16 norm; a page of T tokens holds T times as many). -1 with tq_last_error when
 * codec is NULL or its head_dim and groups are not those tq_codec_init gives for some width. */
int64_t tq_codec_token_bytes(const tq_codec* codec);

/* One layer's paged cache (FORMAT.md, section 6). */
typedef struct tq_paged_cache {
  void* k_pool;                /* 16-byte aligned */
  void* v_pool;                /* 16-byte aligned */
  int64_t k_chunk_bytes;       /* multiple of 16, >= num_kv_heads * tq_page_bytes(&key, T), < 4 GiB */
  int64_t v_chunk_bytes;       /* multiple of 16, >= num_kv_heads * tq_page_bytes(&value, T), < 4 GiB */
  const int32_t* block_table;  /* device [batch][2][max_blocks] chunk indices (0: K, 1: V) */
  int32_t max_blocks;
  int32_t tokens_per_block;    /* T: a multiple of 16 */
  int32_t num_kv_heads;
  int32_t num_chunks;          /* chunks in each pool: entries outside [0, num_chunks) are skipped */
  tq_codec key;
  tq_codec value;
  /* device float32 [num_q_heads] (4-byte aligned), or NULL = zeros: the calibration table's
   * page_lse_shift. The attention calls subtract it (natural log) from the log-sum-exp of the
   * positions read through the cache before merging them with the call's exact positions
   * (k_new, v_new), and their lse output is that of the merged attention. Quantization noise on
   * the packed logits inflates the cached positions' softmax mass by about var/2; this takes it
   * back. Ignored by quantize-append and dequantize. */
  const float* page_lse_shift;
} tq_paged_cache;

/* Bytes of one page of `codec` holding `tokens_per_block` tokens; -1 (with a message) if invalid. */
int64_t tq_page_bytes(const tq_codec* codec, int32_t tokens_per_block);

/* The 2^group_bits[group] levels that this library quantizes group `group` of `codec` to and decodes
 * it with: its codebook on the 8-bit grid (FORMAT.md section 1), into `levels`. Needs no GPU. */
tq_status tq_codebook_levels(const tq_codec* codec, int32_t group, float* levels);

/* Quantize and write `num_tokens` new K and V rows (already rotary-embedded).
 * k, v: [num_tokens][num_kv_heads][head_dim] with row stride `token_stride` elements between
 * tokens (heads contiguous), in `dtype`, 4-byte aligned.
 * Token i goes to sequence seq_idx[i] (in [0, batch)), position pos[i] (device int32 arrays).
 * Serves one decode step (one token per sequence) and the bulk write after a prefill.
 * Each vector's codes are those of the scale searched by FORMAT.md step 4.4; each group's norm
 * field holds the gain norm / <y, c[code]> (FORMAT.md step 4.5), so
 * <x, x_hat> = ||x||^2. A gain beyond fp16's range is stored as 65504 (the reference refuses it; a
 * kernel cannot raise). */
tq_status tq_quantize_append(const tq_paged_cache* cache, const void* k, const void* v,
                             int64_t token_stride, tq_dtype dtype, const int32_t* seq_idx,
                             const int32_t* pos, int32_t num_tokens, int32_t batch,
                             tq_stream stream);

/* Attention of q_len new query tokens per sequence against the sequence's packed history, the new
 * tokens included (they were appended first), in two calls: tq_attention_plan (host only: the
 * split of the keys over CTAs and the workspace it needs, from the call's shape) and
 * tq_attention_run (checks the call's arguments, launches). One plan serves every call of its shape
 * (every layer of a decode step); plan again when batch, q_len or max_kv_len change.
 *
 * The call (tq_attention_params):
 * Query token j of sequence b sits at position kv_lens[b] - q_len + j and attends to positions <= its
 * own (causal); a query token that sees no position (kv_lens[b] < q_len - j) gets the value mean
 * (zeros without a mean).
 * k_new, v_new: the new tokens' own keys and values as they were appended ([batch][q_len]
 * [num_kv_heads][head_dim], token (b, j) at element offset (b * q_len + j) * new_stride, `dtype`,
 * 4-byte aligned, new_stride even and at least num_kv_heads * head_dim), or both NULL. Given, query
 * token j attends to the call's tokens 0..j with them, exactly (not through the cache: the keys and
 * values a token attends to most pay no quantization error, and a prompt's tokens read each other
 * as computed), and to the positions before the call's first through the cache; NULL reads every
 * position from the cache. Calls of more than TQ_MAX_DECODE_Q_LEN tokens take that part on tensor
 * cores in a pass of their own (its states live in the workspace).
 * append (0 or 1): the quantize-append fused in (one launch fewer per decode step): first writes
 * k_new and v_new (required then; q_len at most TQ_MAX_DECODE_Q_LEN) at positions kv_lens[b] - q_len
 * + j, as tq_quantize_append does but rounding y itself (step 4.4 without the scale search, whose
 * code would slow these kernels), then attends exactly as without it given the same rows. The
 * blocks of those positions must be in the table.
 * q, out: [batch][q_len][num_q_heads][head_dim] (contiguous, `dtype`); num_q_heads =
 * group * num_kv_heads with group in 1..TQ_MAX_GQA_GROUP; query head hq uses KV head hq / group.
 * kv_lens: device int32 [batch]. max_kv_len (host) bounds every kv_lens[b] and must not exceed
 * max_blocks * tokens_per_block; it sizes the split-KV grid.
 * softmax_scale multiplies q . k (usually 1/sqrt(head_dim)); positive and finite.
 * lse: NULL, or device float32 [batch][q_len][num_q_heads] (4-byte aligned) that receives each
 * query row's natural-log log-sum-exp over the keys it sees, log(sum_i exp(softmax_scale *
 * q . k_i)), k_i the decoded key including the key mean (the exact key of k_new for the call's
 * positions where given); -inf for a row that sees no key. With it a caller merges this attention
 * with attention over keys kept outside the cache.
 * Limits: q_len 1..TQ_MAX_Q_LEN; batch x ceil(q_len x group / 16) <= 65535 (tq_attention_plan
 * refuses more). Calls of up to 8 query rows per KV head and the longer ones run the same contract
 * on different kernels (a decode step's split pass, a prefill chunk's tensor-core pass). */
#define TQ_ABI_VERSION 3 /* 2: attention as tq_attention_plan + tq_attention_run; 3: tq_codec_init */
#define TQ_MAX_Q_LEN (1 << 20)
typedef struct tq_attention_params {
  const tq_paged_cache* cache;
  const void* q;
  void* out;
  float* lse;              /* or NULL */
  const void* k_new;       /* or NULL, with v_new */
  const void* v_new;
  int64_t new_stride;      /* elements between the new rows' tokens */
  const int32_t* kv_lens;  /* device [batch] */
  int32_t max_kv_len;
  int32_t batch;
  int32_t q_len;
  int32_t num_q_heads;
  float softmax_scale;
  tq_dtype dtype;
  int32_t append;          /* 1: write k_new, v_new into the pages first */
} tq_attention_params;

/* A plan: how a call of one shape splits its keys over CTAs, and the workspace it needs. Filled by
 * tq_attention_plan; read-only to the caller (its fields say what was planned, for tests and
 * profiles). The same inputs give the same plan. */
typedef struct tq_attention_plan_info {
  /* The shape planned for: tq_attention_run takes calls of exactly this shape (the cache's
   * num_kv_heads and head_dim, the params' batch, q_len, num_q_heads and max_kv_len). */
  int32_t batch, q_len, num_q_heads, num_kv_heads, head_dim, max_kv_len;
  int32_t num_sms;           /* the SM count planned for */
  int32_t prefill;           /* 1: the tensor-core pass of 256-row CTAs (long chunks), 0: the split pass */
  int32_t num_splits;        /* KV splits per sequence and KV head */
  int32_t split_tokens;      /* positions per split */
  /* The split pass's plan of 8-warp CTAs, which tq_attention_run takes instead where two of them
   * fit an SM's shared memory at the cache's widths (narrow codes); 0 splits: none. */
  int32_t wide_num_splits;
  int32_t wide_split_tokens;
  /* Workspace bytes (16-byte aligned device memory) for any call of at most this batch, q_len and
   * max_kv_len (same heads, head_dim and SM count), whichever of the plans above it takes, with or
   * without new rows: one allocation for the largest call serves all. */
  size_t workspace_bytes;
} tq_attention_plan_info;

/* Plans calls of this shape on num_sms SMs (0: the current device's, or an H200's 132 where no
 * device answers). Host only: no GPU, no allocation; reads no device memory. Errors: batch, q_len
 * or max_kv_len out of range or beyond the grid limit (TQ_ERR_BAD_LENGTH), head counts, head_dim or
 * num_sms invalid (TQ_ERR_UNSUPPORTED_HEAD_DIM, TQ_ERR_INVALID_ARGUMENT), plan NULL. */
tq_status tq_attention_plan(int32_t batch, int32_t q_len, int32_t num_q_heads, int32_t num_kv_heads,
                            int32_t head_dim, int32_t max_kv_len, int32_t num_sms,
                            tq_attention_plan_info* plan);

/* Runs the attention call `params` with `plan` (made for its shape: else TQ_ERR_INVALID_ARGUMENT).
 * workspace: device memory, 16-byte aligned, of at least the bytes this call needs (never more than
 * plan->workspace_bytes; TQ_ERR_WORKSPACE names the need), for the splits' partial softmax states;
 * not shared between concurrent calls. Every argument is checked before anything is launched. */
tq_status tq_attention_run(const tq_attention_plan_info* plan, const tq_attention_params* params,
                           void* workspace, size_t workspace_bytes, tq_stream stream);

/* TQ_ABI_VERSION of the library (a binding checks it against the header it was written for). */
int32_t tq_abi_version(void);

/* Dequantize positions [start, start + len) of sequence `seq` into k_out, v_out:
 * [len][num_kv_heads][head_dim] in `dtype` (either may be NULL to skip it). For tests and export.
 * start + len must not exceed max_blocks * tokens_per_block. */
tq_status tq_dequantize(const tq_paged_cache* cache, int32_t seq, int32_t start, int32_t len,
                        void* k_out, void* v_out, tq_dtype dtype, tq_stream stream);

#ifdef __cplusplus
}
#endif
#endif /* TQ_KERNELS_H */
