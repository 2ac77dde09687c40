/* CTRN's cells and temporal mean pooling for both texts in one pass, forward and backward (see scan.py,
   ctrn_cells). Per text s with partner p, row b, and the gates already activated, a_t = [z_t | f_t | o_t]:

     c_t  = z_t + f_t  (c_{t-1}  - z_t)          own gates
     cx_t = z_t + fx_t (cx_{t-1} - z_t)          fx_t, ox_t: the partner's f, o at its aligned step t*
     h_t  = (o_t c_t) (ox_t cx_t)                (QRNN, cross = 0: h_t = o_t c_t)
     pooled = sum over real steps of h_t / max(1, real steps)

   A padded step carries both states unchanged (f = 1) and adds nothing to the mean. Backward runs the adjoint
   right to left with the carries dc_{t+1} f_{t+1} and dcx_{t+1} fx_{t+1}, and writes the gradients of the gates'
   pre-activations (tanh' = 1 - z^2, sigmoid' = s (1 - s), from the activated values: no transcendental here);
   the partner's share (through fx, ox) is added at its step t*.

   Arrays are C-contiguous: activations (B, L, 3D), states (B, L, D), masks (B, L) bytes, steps (B, L) int64,
   pooled (B, D). Rows [row_begin, row_end) are independent (a row's partner is the same row), so callers split
   the batch over threads. Plain C, no Python or torch headers. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One step of one row, the loops over D that vectorise: every array is its own (restrict). */
#define CTRN_STEPS(NAME, T)                                                                                    \
    static void NAME##_cross_forward(int64_t dim, const T *restrict z, const T *restrict f, const T *restrict o, \
                                     const T *restrict fx, const T *restrict ox, const T *restrict prev,        \
                                     const T *restrict prevx, T *restrict c, T *restrict cx,                    \
                                     T *restrict pooled) {                                                      \
        for (int64_t j = 0; j < dim; ++j) {                                                                     \
            T cj = z[j] + f[j] * (prev[j] - z[j]), cxj = z[j] + fx[j] * (prevx[j] - z[j]);                      \
            c[j] = cj, cx[j] = cxj;                                                                             \
            pooled[j] += o[j] * cj * (ox[j] * cxj);                                                             \
        }                                                                                                       \
    }                                                                                                           \
                                                                                                                \
    static void NAME##_own_forward(int64_t dim, const T *restrict z, const T *restrict f, const T *restrict o,  \
                                   const T *restrict prev, T *restrict c, T *restrict pooled) {                 \
        for (int64_t j = 0; j < dim; ++j) {                                                                     \
            T cj = z[j] + f[j] * (prev[j] - z[j]);                                                              \
            c[j] = cj;                                                                                          \
            pooled[j] += o[j] * cj;                                                                             \
        }                                                                                                       \
    }                                                                                                           \
                                                                                                                \
    /* gz, gf, go: the text's own gate gradients, written (accumulate = 0) or added to; gfx, gox: the          \
       partner's at t*, added to; dc, dcx: the carries f_{t+1} dc_{t+1}, fx_{t+1} dcx_{t+1}, updated. */        \
    static inline void NAME##_cross_backward(                                                                   \
        int64_t dim, T scale, const T *restrict grad_pooled, const T *restrict z, const T *restrict f,          \
        const T *restrict o, const T *restrict fx, const T *restrict ox, const T *restrict c,                   \
        const T *restrict cx, const T *restrict prev, const T *restrict prevx, T *restrict dc, T *restrict dcx, \
        T *restrict gz, T *restrict gf, T *restrict go, T *restrict gfx, T *restrict gox, int accumulate) {     \
        for (int64_t j = 0; j < dim; ++j) {                                                                     \
            T gh = grad_pooled[j] * scale;                                                                      \
            T p = o[j] * c[j], px = ox[j] * cx[j];                                                              \
            T dp = gh * px, dpx = gh * p;                                                                       \
            T dcj = dp * o[j] + dc[j], dcxj = dpx * ox[j] + dcx[j];                                             \
            T d_z = dcj * (1 - f[j]) + dcxj * (1 - fx[j]);                                                      \
            T vz = d_z * (1 - z[j] * z[j]);                                                                     \
            T vf = dcj * (prev[j] - z[j]) * f[j] * (1 - f[j]);                                                  \
            T vo = dp * c[j] * o[j] * (1 - o[j]);                                                               \
            dc[j] = dcj * f[j], dcx[j] = dcxj * fx[j];                                                          \
            gz[j] = accumulate ? gz[j] + vz : vz;                                                               \
            gf[j] = accumulate ? gf[j] + vf : vf;                                                               \
            go[j] = accumulate ? go[j] + vo : vo;                                                               \
            gfx[j] += dcxj * (prevx[j] - z[j]) * fx[j] * (1 - fx[j]);                                           \
            gox[j] += dpx * cx[j] * ox[j] * (1 - ox[j]);                                                        \
        }                                                                                                       \
    }                                                                                                           \
                                                                                                                \
    static inline void NAME##_own_backward(int64_t dim, T scale, const T *restrict grad_pooled,                 \
                                           const T *restrict z, const T *restrict f, const T *restrict o,       \
                                           const T *restrict c, const T *restrict prev, T *restrict dc,         \
                                           T *restrict gz, T *restrict gf, T *restrict go, int accumulate) {    \
        for (int64_t j = 0; j < dim; ++j) {                                                                     \
            T gh = grad_pooled[j] * scale;                                                                      \
            T dcj = gh * o[j] + dc[j];                                                                          \
            T vz = dcj * (1 - f[j]) * (1 - z[j] * z[j]);                                                        \
            T vf = dcj * (prev[j] - z[j]) * f[j] * (1 - f[j]);                                                  \
            T vo = gh * c[j] * o[j] * (1 - o[j]);                                                               \
            dc[j] = dcj * f[j];                                                                                 \
            gz[j] = accumulate ? gz[j] + vz : vz;                                                               \
            gf[j] = accumulate ? gf[j] + vf : vf;                                                               \
            go[j] = accumulate ? go[j] + vo : vo;                                                               \
        }                                                                                                       \
    }

#define CTRN_CELLS(NAME, T)                                                                                    \
    CTRN_STEPS(NAME, T)                                                                                        \
                                                                                                                \
    static void NAME##_side_forward(const T *act, const T *partner, const uint8_t *mask, const int64_t *steps, \
                                    T *c, T *cx, T *pooled, const T *zeros, int64_t length, int64_t dim,       \
                                    int64_t cross) {                                                            \
        const T *prev = zeros, *prevx = zeros;                                                                  \
        int64_t real = 0;                                                                                       \
        memset(pooled, 0, (size_t)dim * sizeof(T));                                                            \
        for (int64_t t = 0; t < length; ++t) {                                                                  \
            T *ct = c + t * dim, *cxt = cross ? cx + t * dim : ct;                                              \
            if (!mask[t]) { /* padding: f = 1, the states pass through */                                       \
                memcpy(ct, prev, (size_t)dim * sizeof(T));                                                      \
                if (cross) memcpy(cxt, prevx, (size_t)dim * sizeof(T));                                         \
                prev = ct, prevx = cxt;                                                                         \
                continue;                                                                                       \
            }                                                                                                   \
            ++real;                                                                                             \
            const T *z = act + t * 3 * dim;                                                                     \
            if (cross) {                                                                                        \
                const T *fx = partner + steps[t] * 3 * dim + dim;                                               \
                NAME##_cross_forward(dim, z, z + dim, z + 2 * dim, fx, fx + dim, prev, prevx, ct, cxt, pooled); \
            } else {                                                                                            \
                NAME##_own_forward(dim, z, z + dim, z + 2 * dim, prev, ct, pooled);                             \
            }                                                                                                   \
            prev = ct, prevx = cxt;                                                                             \
        }                                                                                                       \
        T scale = (T)1 / (T)(real > 0 ? real : 1);                                                              \
        for (int64_t j = 0; j < dim; ++j) pooled[j] *= scale;                                                   \
    }                                                                                                           \
                                                                                                                \
    /* grad: the text's own (L, 3D) gradients, written (accumulate = 0) or added to (accumulate = 1);           \
       grad_partner: the partner's, always added to. dc, dcx: (D) scratch for the carries. */                   \
    static void NAME##_side_backward(const T *act, const T *partner, const uint8_t *mask, const int64_t *steps, \
                                     const T *c, const T *cx, const T *grad_pooled, T *grad, T *grad_partner,  \
                                     T *dc, T *dcx, const T *zeros, int64_t length, int64_t dim, int64_t cross, \
                                     int accumulate) {                                                          \
        int64_t real = 0;                                                                                       \
        for (int64_t t = 0; t < length; ++t) real += mask[t] != 0;                                              \
        T scale = (T)1 / (T)(real > 0 ? real : 1);                                                              \
        memset(dc, 0, (size_t)dim * sizeof(T));                                                                 \
        memset(dcx, 0, (size_t)dim * sizeof(T));                                                                \
        for (int64_t t = length - 1; t >= 0; --t) {                                                             \
            T *gz = grad + t * 3 * dim;                                                                         \
            if (!mask[t]) { /* nothing reaches a padded step's gates; the carries pass through (f = 1) */       \
                if (!accumulate) memset(gz, 0, (size_t)(3 * dim) * sizeof(T));                                  \
                continue;                                                                                       \
            }                                                                                                   \
            const T *z = act + t * 3 * dim, *ct = c + t * dim, *prev = t > 0 ? c + (t - 1) * dim : zeros;       \
            if (cross) {                                                                                        \
                const T *fx = partner + steps[t] * 3 * dim + dim;                                               \
                T *gfx = grad_partner + steps[t] * 3 * dim + dim;                                               \
                const T *cxt = cx + t * dim, *prevx = t > 0 ? cx + (t - 1) * dim : zeros;                       \
                if (accumulate)                                                                                 \
                    NAME##_cross_backward(dim, scale, grad_pooled, z, z + dim, z + 2 * dim, fx, fx + dim, ct,   \
                                          cxt, prev, prevx, dc, dcx, gz, gz + dim, gz + 2 * dim, gfx, gfx + dim, \
                                          1);                                                                   \
                else                                                                                            \
                    NAME##_cross_backward(dim, scale, grad_pooled, z, z + dim, z + 2 * dim, fx, fx + dim, ct,   \
                                          cxt, prev, prevx, dc, dcx, gz, gz + dim, gz + 2 * dim, gfx, gfx + dim, \
                                          0);                                                                   \
            } else if (accumulate) {                                                                            \
                NAME##_own_backward(dim, scale, grad_pooled, z, z + dim, z + 2 * dim, ct, prev, dc, gz,          \
                                    gz + dim, gz + 2 * dim, 1);                                                 \
            } else {                                                                                            \
                NAME##_own_backward(dim, scale, grad_pooled, z, z + dim, z + 2 * dim, ct, prev, dc, gz,          \
                                    gz + dim, gz + 2 * dim, 0);                                                 \
            }                                                                                                   \
        }                                                                                                       \
    }                                                                                                           \
                                                                                                                \
    int NAME##_forward(const T *act_q, const T *act_a, const uint8_t *mask_q, const uint8_t *mask_a,           \
                       const int64_t *steps_q, const int64_t *steps_a, T *c_q, T *cx_q, T *c_a, T *cx_a,        \
                       T *pooled_q, T *pooled_a, int64_t len_q, int64_t len_a, int64_t dim, int64_t cross,       \
                       int64_t row_begin, int64_t row_end) {                                                    \
        T *zeros = (T *)calloc((size_t)dim, sizeof(T));                                                         \
        if (!zeros) return 1;                                                                                   \
        for (int64_t b = row_begin; b < row_end; ++b) {                                                         \
            const T *aq = act_q + b * len_q * 3 * dim, *aa = act_a + b * len_a * 3 * dim;                       \
            NAME##_side_forward(aq, aa, mask_q + b * len_q, steps_q + b * len_q, c_q + b * len_q * dim,          \
                                cx_q + (cross ? b * len_q * dim : 0), pooled_q + b * dim, zeros, len_q, dim,     \
                                cross);                                                                         \
            NAME##_side_forward(aa, aq, mask_a + b * len_a, steps_a + b * len_a, c_a + b * len_a * dim,          \
                                cx_a + (cross ? b * len_a * dim : 0), pooled_a + b * dim, zeros, len_a, dim,     \
                                cross);                                                                         \
        }                                                                                                       \
        free(zeros);                                                                                            \
        return 0;                                                                                               \
    }                                                                                                           \
                                                                                                                \
    /* grad_q and grad_a (B, L, 3D) need no initial values: the question's are written, then added to; the      \
       answer's zeroed row by row before anything is added. */                                                  \
    int NAME##_backward(const T *act_q, const T *act_a, const uint8_t *mask_q, const uint8_t *mask_a,          \
                        const int64_t *steps_q, const int64_t *steps_a, const T *c_q, const T *cx_q,            \
                        const T *c_a, const T *cx_a, const T *grad_pooled_q, const T *grad_pooled_a,            \
                        T *grad_q, T *grad_a, int64_t len_q, int64_t len_a, int64_t dim, int64_t cross,          \
                        int64_t row_begin, int64_t row_end) {                                                   \
        T *scratch = (T *)calloc((size_t)(3 * dim), sizeof(T));                                                 \
        if (!scratch) return 1;                                                                                 \
        T *dc = scratch, *dcx = scratch + dim, *zeros = scratch + 2 * dim;                                      \
        for (int64_t b = row_begin; b < row_end; ++b) {                                                         \
            const T *aq = act_q + b * len_q * 3 * dim, *aa = act_a + b * len_a * 3 * dim;                       \
            T *gq = grad_q + b * len_q * 3 * dim, *ga = grad_a + b * len_a * 3 * dim;                           \
            memset(ga, 0, (size_t)(len_a * 3 * dim) * sizeof(T));                                               \
            NAME##_side_backward(aq, aa, mask_q + b * len_q, steps_q + b * len_q, c_q + b * len_q * dim,         \
                                 cx_q + (cross ? b * len_q * dim : 0), grad_pooled_q + b * dim, gq, ga, dc, dcx, \
                                 zeros, len_q, dim, cross, 0);                                                  \
            NAME##_side_backward(aa, aq, mask_a + b * len_a, steps_a + b * len_a, c_a + b * len_a * dim,         \
                                 cx_a + (cross ? b * len_a * dim : 0), grad_pooled_a + b * dim, ga, gq, dc, dcx, \
                                 zeros, len_a, dim, cross, 1);                                                  \
        }                                                                                                       \
        free(scratch);                                                                                          \
        return 0;                                                                                               \
    }

CTRN_CELLS(ctrn_cells_f32, float)
CTRN_CELLS(ctrn_cells_f64, double)
