# FSDP_CHECK_JANSSON: JSON for safetensors headers, cluster profiles and checkpoints.
AC_DEFUN([FSDP_CHECK_JANSSON], [
    PKG_CHECK_MODULES([JANSSON], [jansson >= 2.7], [],
        [AC_MSG_ERROR([jansson is required: install libjansson-dev (./bootstrap does it)])])
])
