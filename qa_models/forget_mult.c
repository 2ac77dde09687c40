/* The forget-mult recurrence of QRNN/CTRN and its adjoint, one row of the batch at a time (see scan.py).

   c_t = z_t + f_t (c_{t-1} - z_t)                                   forward, t = 0..L-1
   dc_t = g_t + f_{t+1} dc_{t+1};  df_t = dc_t (c_{t-1} - z_t);  dz_t = dc_t - f_t dc_t;  dc_0 = f_0 dc_0(carry)

   Arrays are (B, L, D) and (B, D), C-contiguous. Rows [row_begin, row_end) are independent, so callers split
   the batch over threads; within a row every access walks memory forward (or backward) contiguously and the
   inner loop over D vectorises. Plain C, no Python or torch headers: it compiles in well under a second. */
#include <stdint.h>
#include <string.h>

#define FORGET_MULT(NAME, T)                                                                                  \
    void NAME##_forward(const T *f, const T *z, const T *c0, T *c, int64_t length, int64_t dim,                 \
                        int64_t row_begin, int64_t row_end) {                                                  \
        for (int64_t b = row_begin; b < row_end; ++b) {                                                        \
            const T *prev = c0 + b * dim;                                                                      \
            int64_t base = b * length * dim;                                                                   \
            for (int64_t t = 0; t < length; ++t, base += dim) {                                                \
                const T *ft = f + base, *zt = z + base;                                                        \
                T *ct = c + base;                                                                              \
                for (int64_t j = 0; j < dim; ++j) ct[j] = zt[j] + ft[j] * (prev[j] - zt[j]);                   \
                prev = ct;                                                                                     \
            }                                                                                                  \
        }                                                                                                      \
    }                                                                                                          \
                                                                                                               \
    /* carry: (B, D), zeroed here; on return it holds dc_0 (the gradient of c0). */                            \
    void NAME##_backward(const T *f, const T *z, const T *c0, const T *c, const T *grad_c, T *grad_f,          \
                         T *grad_z, T *carry, int64_t length, int64_t dim, int64_t row_begin,                  \
                         int64_t row_end) {                                                                    \
        for (int64_t b = row_begin; b < row_end; ++b) {                                                        \
            T *dc_next = carry + b * dim; /* f_{t+1} dc_{t+1} */                                               \
            memset(dc_next, 0, (size_t)dim * sizeof(T));                                                       \
            int64_t base = (b * length + length - 1) * dim;                                                    \
            for (int64_t t = length - 1; t >= 0; --t, base -= dim) {                                           \
                const T *ft = f + base, *zt = z + base, *gt = grad_c + base;                                   \
                const T *prev = t > 0 ? c + base - dim : c0 + b * dim;                                         \
                T *gft = grad_f + base, *gzt = grad_z + base;                                                  \
                for (int64_t j = 0; j < dim; ++j) {                                                            \
                    T dc = gt[j] + dc_next[j];                                                                 \
                    T through = dc * ft[j];                                                                    \
                    gft[j] = dc * (prev[j] - zt[j]);                                                           \
                    gzt[j] = dc - through;                                                                     \
                    dc_next[j] = through;                                                                      \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    }

FORGET_MULT(forget_mult_f32, float)
FORGET_MULT(forget_mult_f64, double)
