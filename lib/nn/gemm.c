/* A GEMM and its epilogue, launched for the built-in models (nn_int.h). */
#include "config.h"

#include <string.h>

#include "nn/nn_int.h"

fsdp_status_t fsdp_nn_gemm(fsdp_dev_t *dev, fsdp_stream_t *s, const fsdp_kernel_t *k)
{
    const fsdp_gemm_epilogue_t *e = &k->u.gemm.epilogue;
    const size_t m = k->u.gemm.m, n = k->u.gemm.n;
    fsdp_kernel_t d;
    fsdp_status_t status;

    /* the separate kernels take C as one dense [M, N] block */
    if (k->kind != FSDP_K_GEMM || k->u.gemm.c_dtype != FSDP_DTYPE_F32 ||
        (e->bias == NULL && e->act == FSDP_ACT_NONE && e->residual == NULL) || k->u.gemm.ldc != n ||
        k->u.gemm.batch > 1)
        return fsdp_dev_kernel(dev, s, k);
    d = *k;
    memset(&d.u.gemm.epilogue, 0, sizeof(d.u.gemm.epilogue));
    status = fsdp_dev_kernel(dev, s, &d);
    if (status == FSDP_OK && e->bias != NULL) {
        memset(&d, 0, sizeof(d));
        d.kind = FSDP_K_BIAS_ADD;
        d.u.bias_add.y = k->u.gemm.c;
        d.u.bias_add.bias = e->bias;
        d.u.bias_add.rows = m;
        d.u.bias_add.cols = n;
        d.u.bias_add.y_dtype = FSDP_DTYPE_F32;
        d.u.bias_add.bias_dtype = e->bias_dtype;
        status = fsdp_dev_kernel(dev, s, &d);
    }
    if (status == FSDP_OK && e->act == FSDP_ACT_RELU) {
        memset(&d, 0, sizeof(d));
        d.kind = FSDP_K_RELU_FWD;
        d.u.relu_fwd.y = k->u.gemm.c;
        d.u.relu_fwd.x = k->u.gemm.c;
        d.u.relu_fwd.n = m * n;
        d.u.relu_fwd.y_dtype = d.u.relu_fwd.x_dtype = FSDP_DTYPE_F32;
        status = fsdp_dev_kernel(dev, s, &d);
    } else if (status == FSDP_OK && e->act == FSDP_ACT_GELU_TANH) {
        memset(&d, 0, sizeof(d));
        d.kind = FSDP_K_GELU_FWD;
        d.u.gelu_fwd.y = k->u.gemm.c;
        d.u.gelu_fwd.x = k->u.gemm.c;
        d.u.gelu_fwd.n = m * n;
        d.u.gelu_fwd.dtype = FSDP_DTYPE_F32;
        status = fsdp_dev_kernel(dev, s, &d);
    }
    if (status == FSDP_OK && e->residual != NULL) {
        memset(&d, 0, sizeof(d));
        d.kind = FSDP_K_ADD;
        d.u.add.y = k->u.gemm.c;
        d.u.add.a = k->u.gemm.c;
        d.u.add.b = e->residual;
        d.u.add.n = m * n;
        d.u.add.dtype = FSDP_DTYPE_F32;
        status = fsdp_dev_kernel(dev, s, &d);
    }
    return status;
}
