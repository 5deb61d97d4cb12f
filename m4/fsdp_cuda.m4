# FSDP_CHECK_CUDA: --with-cuda[=DIR] (default: guess).
# Asked for and missing is an error; under guess a warning. Exports CUDA_CPPFLAGS,
# CUDA_LDFLAGS, CUDA_LIBS, NVCC, NVCCFLAGS, CUDA_HOME and sets fsdp_have_cuda=yes|no.
AC_DEFUN([FSDP_CHECK_CUDA], [
    AC_ARG_WITH([cuda],
        [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@],
                        [CUDA toolkit for the gpu backend (default: guess, /usr/local/cuda)])],
        [], [with_cuda=guess])
    AC_ARG_VAR([NVCC], [CUDA compiler])
    AC_ARG_VAR([NVCCFLAGS], [flags for the CUDA compiler])

    fsdp_have_cuda=no
    CUDA_CPPFLAGS=""
    CUDA_LDFLAGS=""
    CUDA_LIBS=""
    AS_IF([test "x$with_cuda" != xno], [
        AS_CASE([$with_cuda],
            [guess|yes], [CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"],
            [CUDA_HOME="$with_cuda"])
        fsdp_save_CPPFLAGS="$CPPFLAGS"
        fsdp_save_LDFLAGS="$LDFLAGS"
        fsdp_save_LIBS="$LIBS"
        fsdp_cuda_libdir="$CUDA_HOME/lib64"
        AS_IF([test ! -d "$fsdp_cuda_libdir"], [fsdp_cuda_libdir="$CUDA_HOME/lib"])
        CPPFLAGS="$CPPFLAGS -I$CUDA_HOME/include"
        LDFLAGS="$LDFLAGS -L$fsdp_cuda_libdir"
        fsdp_have_cuda=yes
        AC_CHECK_HEADER([cuda_runtime.h], [], [fsdp_have_cuda=no])
        AS_IF([test $fsdp_have_cuda = yes],
              [AC_CHECK_LIB([cudart], [cudaMalloc], [], [fsdp_have_cuda=no])])
        AS_IF([test $fsdp_have_cuda = yes],
              [AC_CHECK_LIB([cublas], [cublasCreate_v2], [], [fsdp_have_cuda=no])])
        AS_IF([test $fsdp_have_cuda = yes], [
            AC_PATH_PROG([NVCC], [nvcc], [no], [$CUDA_HOME/bin$PATH_SEPARATOR$PATH])
            AS_IF([test "x$NVCC" = xno], [fsdp_have_cuda=no])
        ])
        CPPFLAGS="$fsdp_save_CPPFLAGS"
        LDFLAGS="$fsdp_save_LDFLAGS"
        LIBS="$fsdp_save_LIBS"
        AS_IF([test $fsdp_have_cuda = yes], [
            CUDA_CPPFLAGS="-I$CUDA_HOME/include"
            CUDA_LDFLAGS="-L$fsdp_cuda_libdir -Wl,-rpath,$fsdp_cuda_libdir"
            CUDA_LIBS="-lcublas -lcudart"
        ], [
            AS_IF([test "x$with_cuda" != xguess],
                  [AC_MSG_ERROR([CUDA requested (--with-cuda=$with_cuda) but not found under $CUDA_HOME])],
                  [AC_MSG_WARN([CUDA not found under $CUDA_HOME: the gpu backend is off])])
        ])
    ])
    AC_SUBST([CUDA_HOME])
    AC_SUBST([CUDA_CPPFLAGS])
    AC_SUBST([CUDA_LDFLAGS])
    AC_SUBST([CUDA_LIBS])
    AM_CONDITIONAL([HAVE_CUDA], [test "x$fsdp_have_cuda" = xyes])
])
