/* CUDA, cuBLAS and NCCL results converted to fsdp statuses, logged once at the boundary. */
#include "config.h"

#include "gpu.h"

/* Per thread: fsdp_gpu_launch_local runs every rank of a process on its own thread, and each
 * thread's messages name its own rank. A thread that made no dev (a trace flusher) names none. */
static _Thread_local int log_rank = -1;

void fsdp_gpu_set_log_rank(int rank)
{
    log_rank = rank;
}

int fsdp_gpu_log_rank(void)
{
    return log_rank;
}

/* Logs at `level` with the caller's location, prefixed with the rank when one is known. */
static void log_failure(fsdp_log_level_t level, const char *file, int line, const char *func,
                        const char *call, const char *msg, const char *name)
{
    int rank = fsdp_gpu_log_rank();

    if (level > fsdp_log_level())
        return;
    if (rank >= 0)
        fsdp_log_emit(level, file, line, func, "rank %d: %s: %s (%s)", rank, call, msg, name);
    else
        fsdp_log_emit(level, file, line, func, "%s: %s (%s)", call, msg, name);
}

fsdp_status_t fsdp_gpu_cuda_status(cudaError_t err, const char *call, const char *file, int line,
                                   const char *func)
{
    if (err == cudaSuccess || err == cudaErrorNotReady)
        return FSDP_OK;
    /* Reported here, once: the thread's last error is reset, or the next launch check
     * (cudaGetLastError after a kernel) would blame that kernel for this call's failure. A
     * sticky error survives the reset and fails every later call anyway. */
    (void)cudaGetLastError();
    switch (err) {
    case cudaErrorMemoryAllocation:
        /* Not sticky, and the caching allocator may free cached blocks and retry: it reports
         * the out-of-memory with its breakdown if the retry fails too. */
        log_failure(FSDP_LOG_DEBUG, file, line, func, call, cudaGetErrorString(err),
                    cudaGetErrorName(err));
        return FSDP_ERR_OUT_OF_MEMORY;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        log_failure(FSDP_LOG_ERROR, file, line, func, call, cudaGetErrorString(err),
                    cudaGetErrorName(err));
        return FSDP_ERR_NO_DEVICE;
    default:
        log_failure(FSDP_LOG_ERROR, file, line, func, call, cudaGetErrorString(err),
                    cudaGetErrorName(err));
        return FSDP_ERR_BACKEND;
    }
}

fsdp_status_t fsdp_gpu_cublas_status(cublasStatus_t st, const char *call, const char *file,
                                     int line, const char *func)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return FSDP_OK;
    log_failure(FSDP_LOG_ERROR, file, line, func, call, cublasGetStatusString(st),
                cublasGetStatusName(st));
    return st == CUBLAS_STATUS_ALLOC_FAILED ? FSDP_ERR_OUT_OF_MEMORY : FSDP_ERR_BACKEND;
}

fsdp_status_t fsdp_gpu_nccl_status(ncclResult_t res, const char *call, const char *file, int line,
                                   const char *func)
{
    const char *detail;

    if (res == ncclSuccess || res == ncclInProgress)
        return FSDP_OK;
    /* NCCL's last error (thread-local) says more than the code's string. */
    detail = ncclGetLastError(NULL);
    log_failure(FSDP_LOG_ERROR, file, line, func, call, ncclGetErrorString(res),
                detail != NULL && detail[0] != '\0' ? detail : "no detail");
    return res == ncclRemoteError ? FSDP_ERR_RANK_FAILED : FSDP_ERR_BACKEND;
}
