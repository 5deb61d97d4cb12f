/* What the language models (GPT-2, Llama) share around their forward and backward: the batch's
 * token ids on the device, and the loss back on the host (nn_int.h). */
#include "nn/nn_int.h"

fsdp_status_t fsdp_nn_batch_to_device(fsdp_dev_t *dev, fsdp_mem_t *mem, fsdp_stream_t *s,
                                      const int32_t *inputs, const int32_t *targets, size_t n,
                                      int32_t **tokens_p, int32_t **targets_p)
{
    fsdp_status_t status;

    *tokens_p = *targets_p = NULL;
    status = fsdp_mem_alloc(mem, n * sizeof(int32_t), FSDP_MEM_ACTIVATION, s, (void **)tokens_p);
    if (status == FSDP_OK)
        status =
            fsdp_mem_alloc(mem, n * sizeof(int32_t), FSDP_MEM_ACTIVATION, s, (void **)targets_p);
    if (status == FSDP_OK)
        status = dev->ops->memcpy_async(dev, *tokens_p, inputs, n * sizeof(int32_t), s);
    if (status == FSDP_OK)
        status = dev->ops->memcpy_async(dev, *targets_p, targets, n * sizeof(int32_t), s);
    return status;
}

fsdp_status_t fsdp_nn_loss_to_host(fsdp_dev_t *dev, fsdp_stream_t *s, const float *loss,
                                   float loss_scale, float *loss_p)
{
    float host = 0.0f;
    fsdp_status_t status = dev->ops->memcpy_async(dev, &host, loss, sizeof(float), s);

    if (status == FSDP_OK)
        status = dev->ops->stream_synchronize(dev, s);
    if (status == FSDP_OK)
        *loss_p = host / loss_scale;
    return status;
}
